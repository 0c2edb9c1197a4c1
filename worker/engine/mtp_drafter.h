// mtp_drafter.h - the model's own MTP (nextn) layers as a drafter on the stage that owns the
// last main layer (patch 0016 loads them there): the main context hands over the hidden
// stream of every row it decodes, a second context of llama.cpp's MTP type runs the MTP block
// over (token, previous row) pairs, and after a token is sampled it proposes the next ones,
// one greedy pass each, as the pinned draft-mtp path does.
#pragma once

#include "hidden_rows.h"
#include "tail_drafter.h"

#include "llama-cpp.h"
#include "llama.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace meshnet {

struct mtp_drafter_params {
    int32_t n_slots    = 1;
    int32_t n_ctx      = 0; // per slot
    int32_t n_batch    = 512;
    int32_t n_threads  = 1;
    int32_t max_drafts = 3; // tokens proposed per window
    int32_t keep_rows  = 8; // hidden rows held per slot: as far back as a discard may reach, and more
};

class mtp_drafter final : public tail_drafter {
public:
    // Creates the MTP context on `model` (loaded with load_mtp) and makes `main` output its
    // rows' hidden stream; null with `error` on failure.
    static std::unique_ptr<mtp_drafter> init(llama_model * model, llama_context * main, const mtp_drafter_params & params,
                                             std::string & error);

    // After `main` decoded `steps`: keeps their hidden rows and runs the MTP block over them
    // (its own KV, as in plain decoding). A failure forgets those slots' drafter state: they
    // draft nothing until their next step.
    void stepped(const std::vector<drafter_step> & steps) override;

    // Up to `most` (and max_drafts) tokens to follow `token`, sampled for position `pos` of the slot (the
    // slot keeps positions < pos; the drafter forgets what it held from pos on). Empty when
    // the row at pos - 1 is unknown or the context has no room.
    std::vector<int32_t> draft(int32_t slot, int32_t pos, int32_t token, int32_t most) override;

    // The slot's positions >= from are gone (a discard), or all of them (a clear).
    void discard(int32_t slot, int32_t from) override;
    void clear(int32_t slot) override;

    int32_t max_drafts() const override { return params_.max_drafts; }
    // bytes of its state on this stage: the MTP context's KV, the rows held for every slot
    // and the main context's buffer of hidden rows
    size_t state_bytes() const override { return state_bytes_; }

private:
    mtp_drafter(llama_context_ptr ctx, llama_context * main, const mtp_drafter_params & params, size_t row_width);

    llama_context_ptr        ctx_;
    llama_context *          main_;
    mtp_drafter_params       params_;
    size_t                   row_width_;
    llama_batch_ext_ptr      batch_;
    std::vector<hidden_rows> rows_;  // per slot
    std::vector<float>       zeros_; // the row before position 0
    size_t                   state_bytes_ = 0;
};

} // namespace meshnet
