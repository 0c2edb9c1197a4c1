// scheduler.h - the one thread that drives the engine: it batches the queued steps of
// different sessions into one engine step and serialises slot changes. Which queued steps
// are void is step_voiding's; the prefix cache's slots are prefix_slots'.
#pragma once

#include "engine.h"
#include "error_info.h"
#include "prefix_slots.h"
#include "session_store.h"
#include "step_voiding.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace meshnet {


struct step_outcome {
    bool               ok = false;
    shard_error        error{error_reason::engine_failure, "", {}};
    int64_t            n_past = 0;     // positions held after the step
    int32_t            slot = -1;      // the session's slot (engine_i::draft)
    std::vector<float> boundary;       // non-last stage
    // A hit on a stage before the last: the chain of the boundary this stage sent on for the
    // copied prefix, a link per block (what the next stage's lookup must name).
    std::vector<std::string> prefix_chain;
    std::vector<float> logits;         // last stage: output_rows x n_vocab
    int64_t            engine_micros = 0;
    int32_t            batch_sessions = 0;
};

struct step_job {
    session_key          key;
    int64_t              n_past = 0;
    std::vector<int32_t> positions;
    std::vector<int32_t> tokens;
    std::vector<float>   boundary;
    std::vector<int32_t> output_rows;
    int64_t              discard_from = -1; // >= 0: drop positions from here first
    std::vector<int32_t> fed_tokens;    // the step's token ids as the request carried them (prefix cache)
    std::vector<int32_t> prefix_tokens; // a new session's positions 0..n_past-1, to copy from a cached prefix
    bool                 prefix_snapshot = false; // whole-only cache: keep positions 0..n_past-1 as an entry first
    std::string          cache_salt; // the tenant's: prefixes are reused only within one salt
    std::string          boundary_digest; // a grid block's on a later stage: SHA-256 of its boundary bytes as received
    std::vector<std::string> prefix_chain; // with prefix_tokens: the previous stage's output chain for them
    std::function<bool()>               cancelled; // polled before and after the step
    std::function<void(step_outcome &)> done;      // called once, on the engine thread
};

class scheduler {
public:
    // `batch_wait`: how long a step may wait for the steps of other sessions that are
    // in the middle of a generation (used recently) to arrive and join its batch; it
    // waits only while such steps keep arriving (a burst, see `burst_gap`).
    // `pipeline_depth`: stages in the route; the generating sessions are split into that
    // many groups, one engine step each (see `group_size`).
    // `exact_rows`: batch invariance (batch_limits::exact_rows; 0: off).
    scheduler(engine_i & engine, session_store & sessions, int32_t max_step_tokens,
              session_clock::duration batch_wait = std::chrono::microseconds(0),
              int32_t pipeline_depth = 1, size_t exact_rows = 0);
    ~scheduler();

    void start();
    void stop(); // answers queued steps with SESSION_CANCELLED

    void submit(step_job job);
    // Several steps at once: none of them starts before all are queued, so they can
    // share one engine step (the relayed steps of one engine step of the previous stage).
    void submit_all(std::vector<step_job> jobs);

    // While a hold lives the engine thread starts no step: a caller that submits several
    // steps one by one (the answers of one relayed batch feeding their decode loops)
    // holds it so that they share one engine step instead of the first running alone.
    class hold_guard {
    public:
        explicit hold_guard(scheduler & owner);
        ~hold_guard();
        hold_guard(const hold_guard &) = delete;
        hold_guard & operator=(const hold_guard &) = delete;
    private:
        scheduler & owner_;
    };
    hold_guard hold() { return hold_guard(*this); }

    // Runs on the engine thread after the `done` calls of every engine step (the relay
    // sends the steps those calls handed on, as one batch). Set before start().
    void set_after_batch(std::function<void()> after_batch) { after_batch_ = std::move(after_batch); }

    // Forgets the session and clears its slot, or keeps the slot as a prefix cache entry;
    // `done(released)` on the engine thread.
    void release(const session_key & key, std::function<void(bool)> done);

    // The last stage rejected drafts of the session's step whose rows end before `from`:
    // until a step of the session starts below `from` or discards, its steps from `from` on
    // build on rejected rows (a decode loop's later windows, in flight) and are answered
    // STEP_SUPERSEDED unrun, before the step after the rejection comes to void them.
    void rejected_from(const session_key & key, int64_t from);

    // Prefix cache (prefix_cache.h): whole blocks of `block` tokens, up to `max_entries`
    // released sessions' slots kept. Off (0) unless set, before start(), on an engine that
    // can copy a prefix. On one that copies whole sequences only (deepseek4) the entries are
    // the snapshots steps ask for (step_job::prefix_snapshot), each reused only whole.
    void set_prefix_cache(int32_t block, int32_t max_entries) { prefix_.configure(block, max_entries); }
    int32_t prefix_block() const { return prefix_.block(); }
    // On the engine thread, from a step's `done`: the grid block at `n_past` that `slot`
    // stepped was sent on as boundary bytes with SHA-256 `digest` (prefix_cache::sent).
    void prefix_sent(int32_t slot, int64_t n_past, const std::string & digest) { prefix_.sent(slot, n_past, digest); }
    using prefix_counts = meshnet::prefix_counts;
    prefix_counts prefix_stats() const { return prefix_.stats(); }

    int32_t queue_depth() const;
    double  recent_tokens_per_second() const;
    int64_t tokens_processed() const { return tokens_processed_.load(); }
    int64_t steps_run() const { return steps_run_.load(); }
    int64_t engine_micros() const { return engine_micros_.load(); } // in engine steps, all told
    // Steps answered STEP_SUPERSEDED: not run, or on a non-last stage not relayed on, because
    // a later step of their session queued meanwhile discards their positions, or (the last
    // stage) they build on drafts it rejected.
    int64_t superseded_steps() const { return superseded_steps_.load(); }
    // KV cells in use as of the last engine step or release (read without the engine).
    int64_t kv_used() const { return kv_used_.load(); }

private:
    struct release_job {
        session_key               key;
        std::function<void(bool)> done;
    };

    // A burst of steps ends once none has arrived for this long.
    static constexpr session_clock::duration burst_gap = std::chrono::microseconds(300);
    // A session that ran a step this recently is still generating.
    static constexpr session_clock::duration generating_window = std::chrono::seconds(1);

    void run();
    // Takes out of the queue the steps that are void (step_voiding.h), each with the
    // position its voiding starts at (the caller holds mutex_).
    std::vector<std::pair<step_job, int64_t>> take_superseded();
    std::vector<queued_window> queued_windows() const; // the caller holds mutex_
    step_outcome superseded(const step_job & job, int64_t discard_from);
    void wait_for_burst(std::unique_lock<std::mutex> & lock);
    size_t group_size(session_clock::time_point now) const;
    void run_batch(std::vector<step_job> & batch);
    void record_tokens(int64_t n_tokens);
    bool is_live(const session_key & key) const { return sessions_.find(key) >= 0; }

    engine_i &      engine_;
    session_store & sessions_;
    int32_t         max_step_tokens_;
    session_clock::duration batch_wait_;
    int32_t         pipeline_depth_;
    size_t          exact_rows_;

    mutable std::mutex      mutex_;
    std::condition_variable wake_;
    std::deque<step_job>    steps_;
    step_voiding            voiding_; // rejected_from() marks not yet cleared
    session_clock::time_point last_arrival_;
    std::deque<release_job> releases_;
    int                     holds_    = 0;
    bool                    stopping_ = false;
    std::function<void()>   after_batch_;
    std::thread             thread_;

    std::atomic<int64_t> tokens_processed_{0};
    std::atomic<int64_t> steps_run_{0};
    std::atomic<int64_t> engine_micros_{0};
    std::atomic<int64_t> superseded_steps_{0};
    std::atomic<int64_t> kv_used_{0};
    prefix_slots         prefix_;
    mutable std::mutex   rate_mutex_;
    std::deque<std::pair<session_clock::time_point, int64_t>> rate_window_;
};

} // namespace meshnet
