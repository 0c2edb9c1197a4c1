// scheduler.cpp - batching: take queued steps in arrival order as the picker says
// (batch_picker.h) and run them as one engine step.
#include "scheduler.h"

#include "batch_picker.h"
#include "draft_verify.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

namespace meshnet {

static error_reason reason_of(engine_status status) {
    switch (status) {
        case engine_status::invalid_argument:   return error_reason::invalid_boundary;
        case engine_status::cache_miss:         return error_reason::cache_miss;
        case engine_status::capacity_exhausted: return error_reason::capacity_exhausted;
        case engine_status::context_overflow:   return error_reason::context_overflow;
        case engine_status::ok:
        case engine_status::internal:           break;
    }
    return error_reason::engine_failure;
}

scheduler::scheduler(engine_i & engine, session_store & sessions, int32_t max_step_tokens,
                     session_clock::duration batch_wait, int32_t pipeline_depth, size_t exact_rows)
    : engine_(engine), sessions_(sessions), max_step_tokens_(max_step_tokens), batch_wait_(batch_wait),
      pipeline_depth_(std::max<int32_t>(1, pipeline_depth)), exact_rows_(exact_rows),
      prefix_(engine, sessions) {}

scheduler::~scheduler() {
    stop();
}

void scheduler::start() {
    thread_ = std::thread([this] { run(); });
}

void scheduler::stop() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_ && !thread_.joinable()) {
            return;
        }
        stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) {
        thread_.join();
    }
}

void scheduler::submit(step_job job) {
    std::vector<step_job> jobs;
    jobs.push_back(std::move(job));
    submit_all(std::move(jobs));
}

void scheduler::submit_all(std::vector<step_job> jobs) {
    std::vector<step_job> refused;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) {
            refused = std::move(jobs);
        } else {
            last_arrival_ = session_clock::now();
            for (auto & job : jobs) {
                steps_.push_back(std::move(job));
            }
        }
    }
    for (auto & job : refused) { // stopping: answer at once
        step_outcome outcome;
        outcome.error = make_error(error_reason::session_cancelled, "the worker is shutting down");
        job.done(outcome);
    }
    wake_.notify_one();
}

scheduler::hold_guard::hold_guard(scheduler & owner) : owner_(owner) {
    std::lock_guard<std::mutex> lock(owner_.mutex_);
    ++owner_.holds_;
}

scheduler::hold_guard::~hold_guard() {
    {
        std::lock_guard<std::mutex> lock(owner_.mutex_);
        --owner_.holds_;
    }
    owner_.wake_.notify_one();
}

void scheduler::release(const session_key & key, std::function<void(bool)> done) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        releases_.push_back(release_job{key, std::move(done)});
    }
    wake_.notify_one();
}

int32_t scheduler::queue_depth() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int32_t>(steps_.size());
}

void scheduler::record_tokens(int64_t n_tokens) {
    tokens_processed_ += n_tokens;
    const auto now = session_clock::now();
    std::lock_guard<std::mutex> lock(rate_mutex_);
    rate_window_.emplace_back(now, n_tokens);
    while (!rate_window_.empty() && now - rate_window_.front().first > std::chrono::seconds(10)) {
        rate_window_.pop_front();
    }
}

double scheduler::recent_tokens_per_second() const {
    const auto now = session_clock::now();
    std::lock_guard<std::mutex> lock(rate_mutex_);
    int64_t total = 0;
    for (const auto & sample : rate_window_) {
        if (now - sample.first <= std::chrono::seconds(10)) {
            total += sample.second;
        }
    }
    return static_cast<double>(total) / 10.0;
}

void scheduler::run() {
    while (true) {
        std::vector<release_job> releases;
        std::vector<step_job>    batch;
        std::vector<std::pair<step_job, int64_t>> voided;
        bool                     stopping = false;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [this] {
                return stopping_ || (!steps_.empty() && holds_ == 0) || !releases_.empty();
            });
            if (batch_wait_.count() > 0 && !stopping_ && !steps_.empty()) {
                wait_for_burst(lock);
            }
            releases.assign(std::make_move_iterator(releases_.begin()), std::make_move_iterator(releases_.end()));
            releases_.clear();
            for (const release_job & job : releases) {
                voiding_.released(job.key);
            }
            stopping = stopping_;
            if (stopping) {
                batch.assign(std::make_move_iterator(steps_.begin()), std::make_move_iterator(steps_.end()));
                steps_.clear();
            } else if (holds_ == 0) {
                voided = take_superseded();
                std::vector<queued_step> queue;
                queue.reserve(steps_.size());
                for (const step_job & job : steps_) {
                    queue.push_back({job.key, static_cast<int64_t>(job.positions.size())});
                }
                const batch_limits limits{max_step_tokens_, group_size(session_clock::now()), exact_rows_};
                const std::vector<size_t> picked = pick_batch(queue, limits);
                for (size_t i : picked) {
                    batch.push_back(std::move(steps_[i]));
                }
                for (auto it = picked.rbegin(); it != picked.rend(); ++it) {
                    steps_.erase(steps_.begin() + static_cast<std::ptrdiff_t>(*it));
                }
            }
        }
        for (auto & job : releases) {
            const bool released = prefix_.release(job.key);
            if (job.done) {
                job.done(released);
            }
        }
        if (stopping) {
            for (auto & job : batch) {
                step_outcome outcome;
                outcome.error = make_error(error_reason::session_cancelled, "the worker is shutting down");
                job.done(outcome);
            }
            return;
        }
        for (auto & [job, discard_from] : voided) {
            step_outcome outcome = superseded(job, discard_from);
            job.done(outcome);
        }
        if (!batch.empty()) {
            run_batch(batch);
        }
        kv_used_ = engine_.kv_used();
    }
}

std::vector<queued_window> scheduler::queued_windows() const {
    std::vector<queued_window> queue;
    queue.reserve(steps_.size());
    for (const step_job & job : steps_) {
        queue.push_back({job.key, job.n_past, job.discard_from});
    }
    return queue;
}

std::vector<std::pair<step_job, int64_t>> scheduler::take_superseded() {
    if (voiding_.marks() == 0 &&
        std::none_of(steps_.begin(), steps_.end(), [](const step_job & job) { return job.discard_from >= 0; })) {
        return {}; // no mark and no discard: nothing is void (the common case, without copies)
    }
    const std::vector<int64_t> void_from =
        voiding_.void_from(queued_windows(), [this](const session_key & key) { return is_live(key); });
    std::vector<std::pair<step_job, int64_t>> taken; // answered in the order they came
    if (std::none_of(void_from.begin(), void_from.end(), [](int64_t from) { return from >= 0; })) {
        return taken;
    }
    std::deque<step_job> kept;
    for (size_t i = 0; i < steps_.size(); ++i) {
        if (void_from[i] >= 0) {
            taken.emplace_back(std::move(steps_[i]), void_from[i]);
        } else {
            kept.push_back(std::move(steps_[i]));
        }
    }
    steps_ = std::move(kept);
    return taken;
}

void scheduler::rejected_from(const session_key & key, int64_t from) {
    std::lock_guard<std::mutex> lock(mutex_);
    voiding_.rejected_from(key, from, static_cast<size_t>(sessions_.n_slots()),
                           [this](const session_key & marked) { return is_live(marked); });
}

step_outcome scheduler::superseded(const step_job & job, int64_t discard_from) {
    ++superseded_steps_;
    step_outcome outcome;
    outcome.error = make_error(error_reason::step_superseded,
        "the session's positions from " + std::to_string(discard_from) +
        " on are void (a later step discards them, or they follow drafts the last stage rejected); this step (n_past " +
        std::to_string(job.n_past) + ") was not run or passed on",
        {{"discard_from", std::to_string(discard_from)}});
    return outcome;
}

void scheduler::wait_for_burst(std::unique_lock<std::mutex> & lock) {
    // Steps come in bursts: the answers of one batch at the previous stage (or one
    // round of the driver) arrive within a fraction of a millisecond. Wait while the
    // burst goes on, so its steps share one decode (n rows cost less than n
    // decodes), but not for sessions whose steps are elsewhere in the pipeline: a stage
    // that waited for every active session would run in lockstep with the others
    // instead of computing while they do.
    const auto now      = session_clock::now();
    const auto deadline = now + batch_wait_;
    const auto gap      = std::min<session_clock::duration>(batch_wait_, burst_gap);
    const auto active   = static_cast<size_t>(sessions_.recently_used(now, generating_window));
    while (!stopping_ && steps_.size() < active) {
        const auto quiet_until = std::min(last_arrival_ + gap, deadline);
        if (session_clock::now() >= quiet_until) {
            return;
        }
        wake_.wait_until(lock, quiet_until);
    }
}

size_t scheduler::group_size(session_clock::time_point now) const {
    // A pipeline of S stages computes S groups of sessions at once, one at each stage.
    // One step of every generating session would keep the other stages idle while this
    // one computes (and this one idle while they do): the stages would run in lockstep.
    if (pipeline_depth_ <= 1) {
        return SIZE_MAX;
    }
    const size_t generating = std::max(steps_.size(),
        static_cast<size_t>(sessions_.recently_used(now, generating_window)));
    const size_t depth = static_cast<size_t>(pipeline_depth_);
    return std::max<size_t>(1, (generating + depth - 1) / depth);
}

void scheduler::run_batch(std::vector<step_job> & batch) {
    const auto now = session_clock::now();
    std::vector<step_request> requests;
    std::vector<size_t>       request_job; // requests[i] belongs to batch[request_job[i]]
    std::vector<int32_t>      busy = prefix_.unsettled(); // a copy queued earlier may still write them
    std::vector<step_outcome> outcomes(batch.size());

    auto release_slot = [&](const session_key & key) {
        const int32_t slot = sessions_.release(key);
        if (slot >= 0) {
            prefix_.clear(slot);
        }
    };

    for (size_t i = 0; i < batch.size(); ++i) {
        step_job &     job     = batch[i];
        step_outcome & outcome = outcomes[i];
        if (job.cancelled && job.cancelled()) {
            release_slot(job.key);
            outcome.error = make_error(error_reason::session_cancelled, "the call was cancelled; the session was released");
            continue;
        }
        int32_t source = -1;
        if (!job.prefix_tokens.empty() && sessions_.find(job.key) < 0) {
            std::optional<shard_error> miss;
            source = prefix_.source({job.key, job.n_past, job.prefix_tokens, job.prefix_chain, job.cache_salt}, miss);
            if (miss) {
                outcome.error = std::move(*miss);
                continue;
            }
        }
        const session_store::admission admitted = sessions_.admit(job.key, job.n_past, busy, now, source);
        if (admitted.refused == session_store::admission::refusal::cache_miss) {
            outcome.error = make_error(error_reason::cache_miss,
                "the stage holds no state for this session (new, evicted, released or restarted)",
                {{"stage_n_past", "0"}, {"expected_n_past", std::to_string(job.n_past)}});
            continue;
        }
        if (admitted.refused == session_store::admission::refusal::capacity_exhausted) {
            outcome.error = make_error(error_reason::capacity_exhausted,
                "every session slot is held by a recently used session",
                {{"slots_total", std::to_string(sessions_.n_slots())}});
            continue;
        }
        const int32_t slot = admitted.slot;
        if (admitted.fresh && source >= 0) {
            if (!prefix_.copy(source, slot, job.key, job.n_past, busy, now, outcome.prefix_chain)) {
                release_slot(job.key);
                outcome.error = make_error(error_reason::cache_miss, "the stage could not copy the prefix",
                                           {{"stage_n_past", "0"}, {"prefix_held", "0"}});
                continue;
            }
        } else if (admitted.fresh) {
            prefix_.clear(slot); // a reused slot starts empty
        }
        if (job.discard_from >= 0) {
            prefix_.truncated(slot, job.discard_from);
        }
        if (auto error = discard_suffix(engine_, slot, job.discard_from)) {
            outcome.error = std::move(*error);
            continue;
        }
        const int64_t held = engine_.slot_n_past(slot);
        if (held != job.n_past) {
            if (held > job.n_past) {
                release_slot(job.key); // the tail the caller does not know is unusable
            }
            outcome.error = make_error(error_reason::cache_miss,
                "the stage holds " + std::to_string(held) + " positions, the request builds on " +
                std::to_string(job.n_past),
                {{"stage_n_past", std::to_string(held > job.n_past ? 0 : held)},
                 {"expected_n_past", std::to_string(job.n_past)}});
            continue;
        }
        if (job.prefix_snapshot) {
            prefix_.snapshot(slot, job.key, job.n_past, job.cache_salt, busy, now);
        }
        busy.push_back(slot);
        step_request request;
        request.slot        = slot;
        request.positions   = std::move(job.positions);
        request.tokens      = std::move(job.tokens);
        request.boundary    = std::move(job.boundary);
        request.output_rows = job.output_rows;
        requests.push_back(std::move(request));
        request_job.push_back(i);
    }

    bool decoded = false; // some request's decode ran: every queued copy has landed
    if (!requests.empty()) {
        const auto started = session_clock::now();
        std::vector<step_result> results = engine_.step(requests);
        const int64_t micros = std::chrono::duration_cast<std::chrono::microseconds>(
            session_clock::now() - started).count();
        ++steps_run_;
        engine_micros_ += micros;
        int64_t n_tokens = 0;
        const auto finished = session_clock::now();
        for (size_t r = 0; r < requests.size(); ++r) {
            step_job &     job     = batch[request_job[r]];
            step_outcome & outcome = outcomes[request_job[r]];
            outcome.engine_micros  = micros;
            outcome.batch_sessions = static_cast<int32_t>(requests.size());
            step_result * result = r < results.size() ? &results[r] : nullptr;
            if (result == nullptr || result->status != engine_status::ok) {
                const engine_status status = result ? result->status : engine_status::internal;
                if (status == engine_status::internal) {
                    release_slot(job.key); // the engine cleared it; forget the session too
                }
                outcome.error = make_error(reason_of(status),
                    std::string("engine: ") + engine_status_name(status) + (result ? ": " + result->message : ""));
                continue;
            }
            decoded = true;
            n_tokens += static_cast<int64_t>(requests[r].positions.size());
            if (job.cancelled && job.cancelled()) {
                release_slot(job.key);
                outcome.error = make_error(error_reason::session_cancelled, "the call was cancelled; the session was released");
                continue;
            }
            sessions_.touch(job.key, finished);
            prefix_.stepped(requests[r].slot, job.key, job.n_past, job.fed_tokens, job.cache_salt, job.boundary_digest);
            outcome.ok       = true;
            outcome.n_past   = engine_.slot_n_past(requests[r].slot);
            outcome.slot     = requests[r].slot;
            outcome.boundary = std::move(result->boundary);
            outcome.logits   = std::move(result->logits);
        }
        record_tokens(n_tokens);
    }
    prefix_.settle(decoded);

    if (!engine_.info().is_last()) {
        // A step whose positions a step queued meanwhile discards goes no further: the
        // stages after this one would compute a void window.
        std::lock_guard<std::mutex> lock(mutex_);
        const std::vector<queued_window> queue = queued_windows();
        for (size_t i = 0; i < batch.size(); ++i) {
            const int64_t discard_from = outcomes[i].ok ? void_after_run(batch[i].key, batch[i].n_past, queue) : -1;
            if (discard_from >= 0) {
                outcomes[i] = superseded(batch[i], discard_from);
            }
        }
    }
    kv_used_ = engine_.kv_used(); // current before anyone hears of the step
    for (size_t i = 0; i < batch.size(); ++i) {
        batch[i].done(outcomes[i]);
    }
    if (after_batch_) {
        after_batch_();
    }
}

} // namespace meshnet
