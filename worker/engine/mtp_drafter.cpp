// mtp_drafter.cpp - see mtp_drafter.h.
#include "mtp_drafter.h"

#include <algorithm>
#include <cstring>

// llama.cpp's staging API for MTP (src/llama-ext.h at the pin: exported by the library, but a
// header its build does not install), declared as that header does
LLAMA_API void    llama_set_embeddings_nextn(struct llama_context * ctx, bool value, bool masked);
LLAMA_API float * llama_get_embeddings_nextn_ith(struct llama_context * ctx, int32_t i);

namespace meshnet {

std::unique_ptr<mtp_drafter> mtp_drafter::init(llama_model * model, llama_context * main,
                                               const mtp_drafter_params & params, std::string & error) {
    if (llama_model_n_layer_nextn(model) != 1) {
        error = "the MTP drafter runs exactly one MTP block, the model has " +
                std::to_string(llama_model_n_layer_nextn(model));
        return nullptr;
    }
    llama_context_params cparams = llama_context_default_params();
    cparams.ctx_type        = LLAMA_CONTEXT_TYPE_MTP;
    cparams.n_ctx           = static_cast<uint32_t>(params.n_ctx) * static_cast<uint32_t>(params.n_slots);
    cparams.n_seq_max       = static_cast<uint32_t>(params.n_slots);
    cparams.n_batch         = static_cast<uint32_t>(params.n_batch);
    cparams.n_ubatch        = static_cast<uint32_t>(params.n_batch);
    cparams.n_threads       = params.n_threads;
    cparams.n_threads_batch = params.n_threads;
    cparams.kv_unified      = false; // one stream per slot, as the main context
    cparams.swa_full        = true;  // a discard drops any suffix of the block's window exactly
    cparams.n_rs_seq        = 0;
    cparams.no_perf         = true;
    llama_context_ptr ctx(llama_init_from_model(model, cparams));
    if (!ctx) {
        error = "llama.cpp could not create the MTP drafter's context";
        return nullptr;
    }
    // every row of the main context's steps (unmasked: outputs or not), only the drafter's outputs
    llama_set_embeddings_nextn(main, true, /*masked =*/ false);
    llama_set_embeddings_nextn(ctx.get(), true, /*masked =*/ true);
    const size_t row_width = static_cast<size_t>(llama_model_n_embd_out(model));
    std::unique_ptr<mtp_drafter> drafter(new mtp_drafter(std::move(ctx), main, params, row_width));
    const size_t row_bytes = row_width * sizeof(float);
    drafter->state_bytes_ = llama_memory_buffer_size(llama_get_memory(drafter->ctx_.get())) +
                            static_cast<size_t>(params.n_slots) * static_cast<size_t>(params.keep_rows) * row_bytes +
                            static_cast<size_t>(params.n_batch) * row_bytes;
    return drafter;
}

mtp_drafter::mtp_drafter(llama_context_ptr ctx, llama_context * main, const mtp_drafter_params & params,
                         size_t row_width)
    : ctx_(std::move(ctx)), main_(main), params_(params), row_width_(row_width),
      batch_(llama_batch_ext_init(ctx_.get())),
      rows_(static_cast<size_t>(params.n_slots), hidden_rows(row_width, params.keep_rows)),
      zeros_(row_width, 0.0f) {}

void mtp_drafter::stepped(const std::vector<drafter_step> & steps) {
    llama_batch_ext * batch = batch_.get();
    llama_batch_ext_clear(batch);
    llama_memory_t memory = llama_get_memory(ctx_.get());
    // per step: the row before its first position, then its own rows (a prefill's may be
    // more than the slot keeps, yet every one pairs with the next token)
    std::vector<std::vector<float>> rows(steps.size());
    std::vector<size_t>             fed;
    std::vector<int32_t>            slots;
    for (size_t s = 0; s < steps.size(); ++s) {
        const drafter_step & step = steps[s];
        const size_t n = step.tokens->size();
        const float * before = step.pos0 == 0 ? zeros_.data() : rows_[static_cast<size_t>(step.slot)].at(step.pos0 - 1);
        if (before == nullptr) {
            before = zeros_.data(); // held no more (the slot restarted): as at position 0
        }
        std::vector<float> & held = rows[s];
        held.resize((n + 1) * row_width_);
        std::memcpy(held.data(), before, row_width_ * sizeof(float));
        bool complete = true;
        for (size_t i = 0; i < n && complete; ++i) {
            const float * row = llama_get_embeddings_nextn_ith(main_, step.first_index + static_cast<int32_t>(i));
            complete = row != nullptr;
            if (complete) {
                std::memcpy(held.data() + (i + 1) * row_width_, row, row_width_ * sizeof(float));
            }
        }
        if (!complete) {
            clear(step.slot);
            continue;
        }
        // the block's KV at p pairs the token at p with the row at p - 1, as in plain decoding
        llama_memory_seq_rm(memory, step.slot, step.pos0, -1);
        fed.push_back(s);
        slots.push_back(step.slot);
        for (size_t i = 0; i < n; ++i) {
            const int32_t pos   = step.pos0 + static_cast<int32_t>(i);
            const int32_t index = llama_batch_ext_add_token(batch, step.slot, (*step.tokens)[i]);
            const llama_embd state = { held.data() + i * row_width_, 1, row_width_ };
            if (index < 0 || !llama_batch_ext_set_embd_token(batch, index, state) ||
                !llama_batch_ext_set_pos(batch, index, &pos) || !llama_batch_ext_set_output_logits(batch, index, false)) {
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
    for (size_t s : fed) {
        rows[s].erase(rows[s].begin(), rows[s].begin() + static_cast<long>(row_width_)); // the row before
        rows_[static_cast<size_t>(steps[s].slot)].add(steps[s].pos0, rows[s]);
    }
}

std::vector<int32_t> mtp_drafter::draft(int32_t slot, int32_t pos, int32_t token, int32_t most) {
    std::vector<int32_t> drafts;
    if (slot < 0 || slot >= params_.n_slots || pos <= 0) {
        return drafts;
    }
    const float * before = rows_[static_cast<size_t>(slot)].at(pos - 1);
    // the next window is [token, drafts] at pos..: it must fit the slot's context
    const int32_t n_drafts = std::min({most, params_.max_drafts, params_.n_ctx - 1 - pos});
    if (before == nullptr || n_drafts <= 0) {
        return drafts;
    }
    llama_memory_seq_rm(llama_get_memory(ctx_.get()), slot, pos, -1);
    std::vector<float> state(before, before + row_width_);
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx_.get())));
    int32_t last = token;
    for (int32_t i = 0; i < n_drafts; ++i) {
        llama_batch_ext * batch = batch_.get();
        llama_batch_ext_clear(batch);
        const int32_t at    = pos + i;
        const int32_t index = llama_batch_ext_add_token(batch, slot, last);
        const llama_embd row = { state.data(), 1, row_width_ };
        if (index < 0 || !llama_batch_ext_set_embd_token(batch, index, row) || !llama_batch_ext_set_pos(batch, index, &at) ||
            !llama_batch_ext_set_output_logits(batch, index, true) || !decode_or_clear(ctx_.get(), batch_.get(), {slot})) {
            break;
        }
        const float * logits = llama_get_logits_ith(ctx_.get(), index);
        const float * next   = llama_get_embeddings_nextn_ith(ctx_.get(), index);
        if (logits == nullptr || next == nullptr) {
            break;
        }
        last = draft_argmax(logits, n_vocab);
        drafts.push_back(last);
        state.assign(next, next + row_width_);
    }
    return drafts;
}

void mtp_drafter::discard(int32_t slot, int32_t from) {
    if (slot < 0 || slot >= params_.n_slots) {
        return;
    }
    rows_[static_cast<size_t>(slot)].drop_from(from);
    llama_memory_seq_rm(llama_get_memory(ctx_.get()), slot, from, -1);
}

void mtp_drafter::clear(int32_t slot) {
    if (slot < 0 || slot >= params_.n_slots) {
        return;
    }
    rows_[static_cast<size_t>(slot)].clear();
    llama_memory_seq_rm(llama_get_memory(ctx_.get()), slot, -1, -1);
}

} // namespace meshnet
