// dspark_drafter.cpp - see dspark_drafter.h.
#include "dspark_drafter.h"

#include "hidden_rows.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

// llama.cpp's staging API (src/llama-ext.h at the pin: exported by the library, but a header
// its build does not install), declared as that header does
LLAMA_API void            llama_set_embeddings_layer_inp(struct llama_context * ctx, uint32_t lid, bool value);
LLAMA_API float *         llama_get_embeddings_layer_inp(struct llama_context * ctx, uint32_t lid);
LLAMA_API const int32_t * llama_model_target_layer_ids(const struct llama_model * model);
LLAMA_API uint32_t        llama_model_target_layer_ids_n(const struct llama_model * model);
LLAMA_API int32_t         llama_model_dflash_selector_top_k(const struct llama_model * model);

namespace meshnet {

namespace {

std::string meta(const llama_model * model, const char * key) {
    char buf[64] = {};
    return llama_model_meta_val_str(model, key, buf, sizeof(buf)) >= 0 ? std::string(buf) : std::string();
}

std::string layer_list(const std::vector<int32_t> & layers) {
    std::string out;
    for (size_t i = 0; i < layers.size(); ++i) {
        out += (i ? ", " : "") + std::to_string(layers[i]);
    }
    return out;
}

// Why `drafter` cannot draft for `target` on a stage owning [begin, n_layer) ("" when it can).
std::string shape_problem(const llama_model * target, int32_t begin, const dspark_shape & shape,
                          const std::string & path) {
    const int32_t n_layer = llama_model_n_layer(target);
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(target));
    if (shape.target_layers.empty() || shape.block_size < 1) {
        return path + " is not a DSpark drafter: no dflash.target_layers or dflash.block_size";
    }
    if (shape.n_vocab != n_vocab) {
        return "drafter vocabulary mismatch: " + path + " has " + std::to_string(shape.n_vocab) +
               " tokens, the model " + std::to_string(n_vocab);
    }
    if (shape.n_embd != llama_model_n_embd(target)) {
        return path + " reads hidden states of width " + std::to_string(shape.n_embd) + ", the model's are " +
               std::to_string(llama_model_n_embd(target));
    }
    // the input of layer t is there where the stage runs layer t (or t == n_layer: its output)
    std::vector<int32_t> missing;
    for (int32_t t : shape.target_layers) {
        if (t < begin || t > n_layer) {
            missing.push_back(t - 1);
        }
    }
    if (!missing.empty()) {
        return "the DSpark drafter reads the outputs of layers " + layer_list(missing) + ": this stage runs layers " +
               std::to_string(begin) + ".." + std::to_string(n_layer - 1);
    }
    return "";
}

} // namespace

std::unique_ptr<dspark_drafter> dspark_drafter::init(llama_model * model, llama_context * main,
                                                     const dspark_drafter_params & params, std::string & error) {
    llama_model_params mparams = llama_model_default_params();
    mparams.load_mode       = LLAMA_LOAD_MODE_NONE;
    mparams.use_extra_bufts = false; // as the main model: no repacked copies
    llama_model_ptr drafter(llama_model_load_from_file(params.path.c_str(), mparams));
    if (!drafter) {
        error = "llama.cpp could not load the DSpark drafter " + params.path;
        return nullptr;
    }
    if (meta(drafter.get(), "general.architecture") != "dflash" || meta(drafter.get(), "dflash.block_size").empty() ||
        llama_model_dflash_selector_top_k(drafter.get()) > 0) {
        error = params.path + " is not a DSpark drafter (a dflash GGUF with a block size and no DFlash2 selector)";
        return nullptr;
    }
    dspark_shape shape;
    const int32_t * ids = llama_model_target_layer_ids(drafter.get());
    shape.target_layers.assign(ids, ids + llama_model_target_layer_ids_n(drafter.get()));
    shape.n_embd     = llama_model_n_embd(drafter.get());
    shape.n_vocab    = llama_vocab_n_tokens(llama_model_get_vocab(drafter.get()));
    shape.block_size = std::atoi(meta(drafter.get(), "dflash.block_size").c_str());
    shape.sample_from_anchor = meta(drafter.get(), "dflash.sample_from_anchor") != "false";
    shape.causal     = meta(drafter.get(), "dflash.attention.causal") == "true";
    error = shape_problem(model, llama_model_layer_begin(model), shape, params.path);
    if (!error.empty()) {
        return nullptr;
    }
    const int32_t most = shape.sample_from_anchor ? shape.block_size : shape.block_size - 1;
    if (params.max_drafts > most) {
        error = "the DSpark drafter proposes at most " + std::to_string(most) + " tokens per window (its block), not " +
                std::to_string(params.max_drafts);
        return nullptr;
    }

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx           = static_cast<uint32_t>(params.n_ctx) * static_cast<uint32_t>(params.n_slots);
    cparams.n_seq_max       = static_cast<uint32_t>(params.n_slots);
    cparams.n_batch         = static_cast<uint32_t>(params.n_batch);
    cparams.n_ubatch        = static_cast<uint32_t>(params.n_batch);
    cparams.n_threads       = params.n_threads;
    cparams.n_threads_batch = params.n_threads;
    cparams.kv_unified      = false; // one stream per slot, as the main context
    cparams.swa_full        = true;  // a discard drops any suffix of the draft ring exactly
    cparams.no_perf         = true;
    cparams.ctx_other       = main;  // the target's token embeddings and output head
    llama_context_ptr ctx(llama_init_from_model(drafter.get(), cparams));
    if (!ctx) {
        error = "llama.cpp could not create the DSpark drafter's context";
        return nullptr;
    }
    llama_set_causal_attn(ctx.get(), shape.causal);
    for (int32_t t : shape.target_layers) {
        llama_set_embeddings_layer_inp(main, static_cast<uint32_t>(t), true);
    }
    std::unique_ptr<dspark_drafter> out(
        new dspark_drafter(std::move(drafter), std::move(ctx), main, params, std::move(shape)));
    out->state_bytes_ = llama_memory_buffer_size(llama_get_memory(out->ctx_.get())) +
                        out->shape_.target_layers.size() * static_cast<size_t>(out->n_embd_) *
                            static_cast<size_t>(params.n_batch) * sizeof(float);
    return out;
}

dspark_drafter::dspark_drafter(llama_model_ptr model, llama_context_ptr ctx, llama_context * main,
                               const dspark_drafter_params & params, dspark_shape shape)
    : model_(std::move(model)), ctx_(std::move(ctx)), main_(main), params_(params), shape_(std::move(shape)),
      n_embd_(shape_.n_embd), mask_token_(llama_vocab_mask(llama_model_get_vocab(model_.get()))),
      batch_(llama_batch_ext_init(ctx_.get())), fed_end_(static_cast<size_t>(params.n_slots), 0) {
    if (mask_token_ < 0) {
        mask_token_ = 0;
    }
}

void dspark_drafter::stepped(const std::vector<drafter_step> & steps) {
    llama_batch_ext * batch = batch_.get();
    llama_batch_ext_clear(batch);
    llama_memory_t memory = llama_get_memory(ctx_.get());
    const size_t n_tapped = shape_.target_layers.size();
    const size_t width    = static_cast<size_t>(n_embd_);
    std::vector<const float *> tapped(n_tapped);
    for (size_t k = 0; k < n_tapped; ++k) {
        tapped[k] = llama_get_embeddings_layer_inp(main_, static_cast<uint32_t>(shape_.target_layers[k]));
    }
    // every row's tapped states side by side, as the drafter's fc reads them
    size_t n_rows = 0;
    for (const drafter_step & step : steps) {
        n_rows += static_cast<size_t>(step.n_rows);
    }
    std::vector<float> features(n_rows * n_tapped * width);
    std::vector<int32_t> slots;
    size_t row = 0;
    for (const drafter_step & step : steps) {
        // the rows at pos0 and after replace whatever it held there (rejected drafts, noise)
        llama_memory_seq_rm(memory, step.slot, step.pos0, -1);
        slots.push_back(step.slot);
        for (size_t i = 0; i < static_cast<size_t>(step.n_rows); ++i, ++row) {
            float * dst = features.data() + row * n_tapped * width;
            for (size_t k = 0; k < n_tapped; ++k) {
                const size_t at = static_cast<size_t>(step.first_index) + i;
                std::memcpy(dst + k * width, tapped[k] + at * width, width * sizeof(float));
            }
            const int32_t pos   = step.pos0 + static_cast<int32_t>(i);
            const llama_embd in = { dst, 1, n_tapped * width };
            const int32_t index = llama_batch_ext_add_embd(batch, step.slot, in);
            if (index < 0 || !llama_batch_ext_set_pos(batch, index, &pos) ||
                !llama_batch_ext_set_output_logits(batch, index, false)) {
                for (int32_t slot : slots) {
                    clear(slot);
                }
                return;
            }
        }
    }
    if (slots.empty() || !decode_or_clear(ctx_.get(), batch_.get(), slots)) {
        return;
    }
    for (const drafter_step & step : steps) {
        fed_end_[static_cast<size_t>(step.slot)] = step.pos0 + step.n_rows;
    }
}

std::vector<int32_t> dspark_drafter::draft(int32_t slot, int32_t pos, int32_t token, int32_t most) {
    std::vector<int32_t> drafts;
    if (slot < 0 || slot >= params_.n_slots || pos <= 0) {
        return drafts;
    }
    // the rows before pos are held (a later position of a verify window is a rejected draft)
    if (fed_end_[static_cast<size_t>(slot)] < pos) {
        return drafts;
    }
    discard(slot, pos);
    // the next window is [token, drafts] at pos..: it must fit the slot's context
    const int32_t n_drafts = std::min({most, params_.max_drafts, params_.n_ctx - 1 - pos});
    if (n_drafts <= 0) {
        return drafts;
    }
    // the block: the anchor (the sampled token), then mask tokens; an anchor-first drafter
    // reads its drafts from every row, the others from the rows after the anchor
    const int32_t first   = shape_.sample_from_anchor ? 0 : 1;
    const int32_t n_block = n_drafts + first;
    llama_batch_ext * batch = batch_.get();
    llama_batch_ext_clear(batch);
    std::vector<int32_t> index(static_cast<size_t>(n_block));
    for (int32_t i = 0; i < n_block; ++i) {
        const int32_t at = pos + i;
        index[static_cast<size_t>(i)] = llama_batch_ext_add_token(batch, slot, i == 0 ? token : mask_token_);
        if (index[static_cast<size_t>(i)] < 0 || !llama_batch_ext_set_pos(batch, index[static_cast<size_t>(i)], &at) ||
            !llama_batch_ext_set_output_logits(batch, index[static_cast<size_t>(i)], i >= first)) {
            return drafts;
        }
    }
    if (!decode_or_clear(ctx_.get(), batch_.get(), {slot})) {
        return drafts;
    }
    const int32_t n_vocab = shape_.n_vocab;
    for (int32_t i = first; i < n_block; ++i) {
        const float * logits = llama_get_logits_ith(ctx_.get(), index[static_cast<size_t>(i)]);
        if (logits == nullptr) {
            break;
        }
        drafts.push_back(draft_argmax(logits, n_vocab));
    }
    // the block's own keys are no context: the verified rows replace them
    llama_memory_seq_rm(llama_get_memory(ctx_.get()), slot, pos, -1);
    return drafts;
}

void dspark_drafter::discard(int32_t slot, int32_t from) {
    if (slot < 0 || slot >= params_.n_slots) {
        return;
    }
    int32_t & end = fed_end_[static_cast<size_t>(slot)];
    end = std::min(end, std::max(from, 0));
    llama_memory_seq_rm(llama_get_memory(ctx_.get()), slot, from, -1);
}

void dspark_drafter::clear(int32_t slot) {
    if (slot < 0 || slot >= params_.n_slots) {
        return;
    }
    fed_end_[static_cast<size_t>(slot)] = 0;
    llama_memory_seq_rm(llama_get_memory(ctx_.get()), slot, -1, -1);
}

} // namespace meshnet
