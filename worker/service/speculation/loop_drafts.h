// loop_drafts.h - the drafts of a speculative decode loop (ForwardRequest.loop_drafts),
// made by the first stage from the session's own tokens: prompt lookup proposes what
// followed the latest earlier occurrence of the context's longest suffix (up to 3
// tokens), and the draft length adapts to how the drafts fare. The same rules as the
// driver's meshnet.route.drafts, so a loop drafts as the driver would.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

namespace meshnet {

// Drafts per step at most: a step of 8 rows is the widest whose rows a probe measures
// (max_exact_step_rows); a loop drafts fewer where its stage measured a narrower exact step.
constexpr uint32_t max_loop_drafts = 7;

// An n-gram index over a growing token sequence: n-gram -> where the tokens after its
// latest occurrence begin.
class prompt_lookup {
public:
    static constexpr int max_ngram = 3;

    void extend(const std::vector<int32_t> & tokens);
    // Up to `length` tokens that followed the longest earlier match of the suffix.
    std::vector<int32_t> draft(int length) const { return draft_after({}, length); }
    // The same for the sequence followed by `tail` (tokens not committed yet: the drafts of
    // windows still in flight), matched against the sequence's n-grams; what follows a match
    // may run on into `tail`.
    std::vector<int32_t> draft_after(const std::vector<int32_t> & tail, int length) const;

private:
    std::vector<int32_t>                      tokens_;
    std::map<std::vector<int32_t>, std::size_t> index_;
};

// How many tokens to draft next: doubles after a step whose drafts all held, falls to
// what held after a rejection, and after `patience` steps in a row with nothing accepted
// pauses for `pause` tokens (doubling up to `max_pause` while the probes keep failing).
class draft_length {
public:
    explicit draft_length(int most) : most_(most), length_(most) {}

    int  wanted() const { return paused_for_ > 0 ? 0 : length_; }
    void decoded_plainly(int tokens);
    void verified(int drafted, int accepted);

private:
    static constexpr int patience  = 3;
    static constexpr int pause     = 8;
    static constexpr int max_pause = 64;

    const int most_;
    int       length_;
    int       failures_   = 0;
    int       paused_for_ = 0;
    int       next_pause_ = pause;
};

// What stands in for prompt lookup and the adaptive length in a benchmark: the same four
// calls as loop_drafter's below.
class loop_draft_source {
public:
    virtual ~loop_draft_source() = default;
    virtual void answered(const std::vector<int32_t> & fed, const std::vector<int32_t> & produced) = 0;
    virtual std::vector<int32_t> next(int room) const = 0;
    virtual std::vector<int32_t> after(const std::vector<int32_t> & tail, int room) const = 0;
    virtual int wanted() const = 0;
};

// Makes a loop's stand-in drafter from its draft length at most and its context. Null in
// meshnet-shard-worker, which has no code that sets it: only meshnet-shard-worker-bench
// (bench_oracle.cpp) does, so no recipe, route or flag can reach it.
using loop_draft_source_factory = std::unique_ptr<loop_draft_source> (*)(int most,
                                                                          const std::vector<int32_t> & context);
extern loop_draft_source_factory bench_loop_draft_source;

// One loop's drafting: the lookup over its context and its draft length.
class loop_drafter {
public:
    loop_drafter(int most, const std::vector<int32_t> & context)
        : length_(most), bench_(bench_loop_draft_source ? bench_loop_draft_source(most, context) : nullptr) {
        lookup_.extend(context);
    }

    // The step that fed `fed` answered `produced` (the accepted drafts, then one more).
    void answered(const std::vector<int32_t> & fed, const std::vector<int32_t> & produced);
    // Drafts for the next step, at most `room` tokens.
    std::vector<int32_t> next(int room) const;
    // Up to `room` tokens after the context and `tail` (windows in flight), whatever the
    // draft length says: a pipelined window's first token is one of them.
    std::vector<int32_t> after(const std::vector<int32_t> & tail, int room) const {
        return bench_ ? bench_->after(tail, room) : lookup_.draft_after(tail, room);
    }
    // The draft length the adaptation wants now (0 while paused).
    int wanted() const { return bench_ ? bench_->wanted() : length_.wanted(); }

private:
    prompt_lookup lookup_;
    draft_length  length_;
    std::unique_ptr<loop_draft_source> bench_; // null outside meshnet-shard-worker-bench
};

} // namespace meshnet
