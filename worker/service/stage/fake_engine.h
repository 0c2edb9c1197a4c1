// fake_engine.h - a deterministic engine_i for the service's unit tests only (ctest):
// arithmetic instead of a model, so tests can predict every boundary and token.
#pragma once

#include "engine.h"

#include <atomic>
#include <functional>
#include <mutex>
#include <vector>

namespace meshnet {

// Rows are [token, position, layers_applied, history]: the first stage embeds a token
// as [token, pos, 0, n_past]; every owned layer adds 1 to layers_applied; the last
// stage's logits peak at (token + position + layers_applied) % n_vocab.
class fake_engine final : public engine_i {
public:
    static constexpr int32_t fake_n_embd  = 4;
    static constexpr int32_t fake_n_vocab = 64;

    fake_engine(int32_t n_layer, int32_t layer_begin, int32_t layer_end, int32_t n_slots, int32_t n_ctx);

    const engine_info & info() const override { return info_; }
    std::vector<step_result> step(const std::vector<step_request> & requests) override;
    int32_t slot_n_past(int32_t slot) const override;
    void    slot_clear(int32_t slot) override;
    discard_result slot_discard(int32_t slot, int32_t from) override;
    bool    slot_copy_prefix(int32_t source, int32_t slot, int32_t n) override;
    int64_t kv_used() const override;
    int64_t kv_total() const override;
    engine_status tokenize(const std::string & text, bool add_special, const std::vector<text_range> & literal,
                           std::vector<int32_t> & out) const override;
    engine_status detokenize(const std::vector<int32_t> & tokens, std::string & out) const override;

    // Test hooks: runs at the start of every step (e.g. to block it); slots whose
    // next step fails with `internal`; sizes of the batches seen so far.
    std::function<void()> before_step;
    void fail_next_step_of(int32_t slot);
    std::vector<size_t> batch_sizes() const;
    // Whether the fake memory can drop a suffix (GetInfo can_discard), and how many
    // positions at most per discard (GetInfo discard_depth; 0: any); before serving.
    void set_can_discard(bool can, int32_t depth = 0) {
        info_.can_discard   = can;
        info_.discard_depth = depth;
    }

    // Copies a slot's first positions at once, as llama.cpp's memory does; before serving.
    void set_copies_prefix() { info_.can_copy_prefix = true; }
    // Copies whole sequences only, landing at the next step that computes (as deepseek4's
    // memory does); before serving. Copies that landed in a slot a step computes in: a
    // copy queued by an earlier step onto a slot since given to a session (must stay 0).
    void set_copies_whole() {
        info_.can_copy_prefix   = true;
        info_.copies_whole_only = true;
    }
    size_t pending_copies() const;
    int    copies_onto_live() const;

    // The token the last stage predicts after a row (for assertions).
    static int32_t expected_token(int32_t token, int32_t position, int32_t n_layer);

private:
    engine_info            info_;
    mutable std::mutex     mutex_;
    std::vector<int32_t>   slot_n_past_;
    std::vector<bool>      fail_slot_;
    std::vector<size_t>    batch_sizes_;
    struct pending_copy {
        int32_t source, slot, n;
    };
    std::vector<pending_copy> pending_; // copies not landed yet
    int                    copies_onto_live_ = 0;
};

} // namespace meshnet
