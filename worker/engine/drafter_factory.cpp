// drafter_factory.cpp - see drafter_factory.h.
#include "drafter_factory.h"

#include "dspark_drafter.h"
#include "mtp_drafter.h"

namespace meshnet {

namespace {

// What the MTP tensors take in the stage's weight buffer (each padded to the CPU buffer's
// alignment): its blocks and, on a stage that does not embed its own input, the token
// embeddings (patch 0016 loads them there).
size_t mtp_weight_bytes(const gguf_facts & facts, bool owns_embeddings) {
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    const size_t align = cpu ? ggml_backend_buft_get_alignment(ggml_backend_dev_buffer_type(cpu)) : 1;
    const auto padded = [align](size_t bytes) { return (bytes + align - 1) / align * align; };
    size_t total = 0;
    for (size_t bytes : facts.nextn_tensors) {
        total += padded(bytes);
    }
    if (!owns_embeddings && !facts.nextn_embeds) {
        total += padded(facts.token_embd_bytes);
    }
    return total;
}

// A drafter's parameters sized as the stage is: its slots, their context, its step.
template <typename drafter_params>
drafter_params sized_for(const engine_params & params, const engine_info & stage, const drafter_host & host) {
    drafter_params dparams;
    dparams.n_slots    = stage.n_slots;
    dparams.n_ctx      = stage.n_ctx;
    dparams.n_batch    = host.n_batch;
    dparams.n_threads  = host.n_threads;
    dparams.max_drafts = params.drafter_k;
    return dparams;
}

bool build_mtp(const engine_params & params, const gguf_facts & facts, const engine_info & stage,
               const drafter_host & host, hosted_drafter & out, std::string & error) {
    mtp_drafter_params dparams = sized_for<mtp_drafter_params>(params, stage, host);
    // the row before a step's first position, as far back as a discard reaches
    dparams.keep_rows  = stage.discard_depth + 2 * (params.drafter_k + 1);
    std::unique_ptr<mtp_drafter> mtp = mtp_drafter::init(host.model, host.ctx, dparams, error);
    if (!mtp) {
        return false;
    }
    out.facts.kind          = drafter_kind::mtp;
    out.facts.max_drafts    = params.drafter_k;
    out.facts.weight_bytes  = mtp_weight_bytes(facts, stage.is_first());
    out.facts.state_bytes   = mtp->state_bytes();
    out.facts.target_layers = { stage.n_layer - 1 };
    out.facts.n_vocab       = stage.n_vocab;
    out.needs_token_ids     = true;
    out.drafter             = std::move(mtp);
    return true;
}

bool build_dspark(const engine_params & params, const gguf_facts & facts, const engine_info & stage,
                  const drafter_host & host, hosted_drafter & out, std::string & error) {
    dspark_drafter_params dparams = sized_for<dspark_drafter_params>(params, stage, host);
    dparams.path = params.drafter_model;
    std::unique_ptr<dspark_drafter> dspark = dspark_drafter::init(host.model, host.ctx, dparams, error);
    if (!dspark) {
        return false;
    }
    out.facts.kind         = drafter_kind::dspark;
    out.facts.max_drafts   = params.drafter_k;
    // its own file, and the token embeddings the stage loads for it
    out.facts.weight_bytes = dspark->weight_bytes() + mtp_weight_bytes(facts, stage.is_first());
    out.facts.state_bytes  = dspark->state_bytes();
    for (int32_t t : dspark->shape().target_layers) {
        out.facts.target_layers.push_back(t - 1); // the main layer whose output it is
    }
    out.facts.n_vocab      = dspark->shape().n_vocab;
    out.own_weight_bytes   = dspark->weight_bytes();
    out.drafter            = std::move(dspark);
    return true;
}

} // namespace

std::string drafter_problem(const engine_params & params, const gguf_facts & facts, const layer_range & range) {
    if (params.drafter == drafter_kind::none) {
        return "";
    }
    if (params.drafter_k < 1 || params.drafter_k > 7) {
        return "the drafter proposes 1 to 7 tokens per window, got " + std::to_string(params.drafter_k);
    }
    switch (params.drafter) {
        case drafter_kind::none:
            return "";
        case drafter_kind::dspark:
            if (params.drafter_model.empty()) {
                return "the dspark drafter needs its GGUF (drafter_model)";
            }
            if (facts.arch != "deepseek4" || range.end != facts.n_layer) {
                return "the dspark drafter runs on the last stage of a deepseek4 model, not layers " + range.str() +
                       " of " + facts.arch;
            }
            return ""; // which layers it reads, the drafter's own file says (dspark_drafter::init)
        case drafter_kind::mtp:
            if (facts.arch != "deepseek4" || facts.n_nextn <= 0) {
                return "the mtp drafter needs a deepseek4 model with MTP (nextn) layers; " + params.model_path +
                       " is " + facts.arch + " with " + std::to_string(facts.n_nextn) + " MTP layers";
            }
            if (range.end != facts.n_layer) {
                return "the mtp drafter reads the output of layer " + std::to_string(facts.n_layer - 1) +
                       ": only the stage owning it (the route's last) can host it, not layers " + range.str();
            }
            return "";
    }
    return "";
}

bool drafter_loads_mtp(drafter_kind kind) {
    return kind == drafter_kind::mtp || kind == drafter_kind::dspark;
}

bool drafter_build(const engine_params & params, const gguf_facts & facts, const engine_info & stage,
                   const drafter_host & host, hosted_drafter & out, std::string & error) {
    out = hosted_drafter{};
    switch (params.drafter) {
        case drafter_kind::none:   return true;
        case drafter_kind::mtp:    return build_mtp(params, facts, stage, host, out, error);
        case drafter_kind::dspark: return build_dspark(params, facts, stage, host, out, error);
    }
    return true;
}

} // namespace meshnet
