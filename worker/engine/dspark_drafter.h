// dspark_drafter.h - a DSpark drafter GGUF (llama.cpp architecture `dflash` with a DeepSeek V4
// backbone) hosted on the last stage of a deepseek4 route. It reads the hidden states entering
// a few target layers (metadata target_layers; llama.cpp's layer-input index, so entry i is
// the output of main layer i - 1), which only the stage owning them has: after each step the
// main context decodes, those rows are fused into the drafter's own KV at their positions; after
// a token is sampled, one pass over the block [token, mask...] proposes the next window's
// tokens, the Markov head chaining them, as the pinned draft-dspark path does (greedy).
// The drafter borrows the target's token embeddings and output head through its context's
// ctx_other (the main context): the last stage loads the embeddings for it (patch 0017).
#pragma once

#include "tail_drafter.h"

#include "llama-cpp.h"
#include "llama.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace meshnet {

struct dspark_drafter_params {
    std::string path;           // the drafter GGUF
    int32_t     n_slots    = 1;
    int32_t     n_ctx      = 0; // per slot
    int32_t     n_batch    = 512;
    int32_t     n_threads  = 1;
    int32_t     max_drafts = 3; // tokens proposed per window (at most the trained block)
};

// What a drafter GGUF says about itself, read before it is hosted.
struct dspark_shape {
    std::vector<int32_t> target_layers; // llama.cpp's layer-input indices
    int32_t              n_embd     = 0;
    int32_t              n_vocab    = 0;
    int32_t              block_size = 0;
    bool                 sample_from_anchor = true; // the anchor's own row drafts the first token
    bool                 causal     = false;        // attention inside the block
};

class dspark_drafter final : public tail_drafter {
public:
    // Loads the drafter for `main` (the last stage's context of `model`, owning layers
    // [layer_begin, n_layer)) and makes `main` output the rows it reads; null with `error`
    // when the file is not a DSpark drafter of this model or the stage lacks a tapped layer.
    static std::unique_ptr<dspark_drafter> init(llama_model * model, llama_context * main,
                                                const dspark_drafter_params & params, std::string & error);

    void stepped(const std::vector<drafter_step> & steps) override;
    std::vector<int32_t> draft(int32_t slot, int32_t pos, int32_t token, int32_t most) override;
    void discard(int32_t slot, int32_t from) override;
    void clear(int32_t slot) override;

    int32_t max_drafts() const override { return params_.max_drafts; }
    // the drafter context's KV and the main context's buffers of tapped rows
    size_t state_bytes() const override { return state_bytes_; }
    size_t weight_bytes() const { return llama_model_buffer_size(model_.get()); }
    const dspark_shape & shape() const { return shape_; }

private:
    dspark_drafter(llama_model_ptr model, llama_context_ptr ctx, llama_context * main,
                   const dspark_drafter_params & params, dspark_shape shape);

    llama_model_ptr       model_;
    llama_context_ptr     ctx_;
    llama_context *       main_;
    dspark_drafter_params params_;
    dspark_shape          shape_;
    int32_t               n_embd_;
    int32_t               mask_token_;
    llama_batch_ext_ptr   batch_;
    std::vector<int32_t>  fed_end_; // per slot: the position after the last row it holds
    size_t                state_bytes_ = 0;
};

} // namespace meshnet
