// forward_stream.cpp - the ForwardStream reactor: one stream of steps, answered in order,
// and the first stage's decode loop (plain or speculative) that it runs by itself.
#include "forward_stream.h"
#include "loop_drafts.h"
#include "write_queue.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace meshnet {

namespace {

// One stream of steps, answered in order; cancelling it releases its sessions. A step
// with continue_tokens runs a decode loop here: every sampled token is answered and fed
// back in as the next step until the count, a stop token, an error or a cancellation.
class forward_stream_reactor final
    : public grpc::ServerBidiReactor<pb::ForwardStreamRequest, pb::ForwardStreamResponse> {
public:
    explicit forward_stream_reactor(stage_core & core) : core_(core) {
        reading_ = true;
        StartRead(&request_);
    }

    void OnReadDone(bool ok) override {
        std::unique_lock<std::recursive_mutex> lock(mutex_);
        reading_ = false;
        if (!ok) { // half-close or cancellation: finish once the work in hand is answered
            reads_done_ = true;
            maybe_finish(lock);
            return;
        }
        pending_.push_back(request_.forward());
        if (in_flight_ == 0) {
            start_next(lock);
        }
        read_more();
    }

    void OnWriteDone(bool ok) override {
        std::unique_lock<std::recursive_mutex> lock(mutex_);
        writes_.done();
        if (!ok) {
            fail(lock, grpc::Status(grpc::StatusCode::CANCELLED, "the stream was closed while answering"));
            return;
        }
        send_due(lock);
        maybe_finish(lock);
    }

    void OnCancel() override {
        cancelled_ = true;
        std::lock_guard<std::recursive_mutex> lock(mutex_);
        for (const auto & key : keys_) {
            core_.release(key);
        }
        keys_.clear();
    }

    void OnDone() override {
        delete this;
    }

private:
    // Runs the next queued request (the caller holds the lock and no step is in flight).
    void start_next(std::unique_lock<std::recursive_mutex> & lock) {
        if (pending_.empty() || finishing_) {
            return;
        }
        pb::ForwardRequest request = std::move(pending_.front());
        pending_.pop_front();
        read_more();
        submit(lock, std::move(request));
    }

    // Reads the next request unless enough wait already: a client that sends faster than
    // the steps run is held back by the transport's flow control, so what one stream
    // holds here stays bounded (the caller holds the lock).
    void read_more() {
        if (finishing_ || reads_done_ || reading_ || pending_.size() >= max_waiting_requests) {
            return;
        }
        reading_ = true;
        StartRead(&request_);
    }

    // One step of the stream: whether its loop went on already (by the ring's token or its
    // answer, whichever came first), and where its answer goes in the stream's order.
    struct step_state {
        uint64_t seq      = 0;
        bool     advanced = false;
        bool     ring     = false;   // waits for the ring's token too
        session_key key;
        int64_t  position = 0;       // the step's n_past: the ring's key (a loop's steps
                                     // start ever later; after rejected drafts they can
                                     // end at the same place)
        std::shared_ptr<loop_drafter> drafter; // a speculative loop's drafts (else null)
    };

    void submit(std::unique_lock<std::recursive_mutex> & lock, pb::ForwardRequest request,
                std::shared_ptr<loop_drafter> drafter = nullptr) {
        step_job job;
        auto plan = std::make_shared<output_plan>();
        if (auto error = core_.prepare(request, job, *plan, /*streaming =*/ true)) {
            fail(lock, error_status(*error));
            return;
        }
        if (!drafter && request.loop_drafts() > 0 && plan->continue_tokens > 0) {
            std::vector<int32_t> context(request.draft_context().begin(), request.draft_context().end());
            context.insert(context.end(), request.tokens().begin(), request.tokens().end());
            drafter = std::make_shared<loop_drafter>(static_cast<int>(request.loop_drafts()), context);
            request.clear_draft_context(); // in the drafter now; the loop's steps copy the request
        }
        ++in_flight_;
        keys_.insert(job.key);
        const auto arrived = std::chrono::steady_clock::now();
        auto step = std::make_shared<step_state>();
        step->seq      = next_seq_++;
        step->key      = job.key;
        step->position = request.n_past();
        step->ring     = plan->relay && plan->relay_request.ring() && plan->continue_tokens > 0;
        step->drafter  = std::move(drafter);
        auto template_request = std::make_shared<pb::ForwardRequest>(std::move(request));
        if (step->ring) {
            ++ring_waiting_;
            core_.ring().expect(step->key, step->position, [this, plan, template_request, step](
                                       std::vector<int32_t> tokens) {
                std::unique_lock<std::recursive_mutex> inner(mutex_);
                --ring_waiting_;
                if (advance(inner, *plan, *template_request, *step, std::move(tokens))) {
                    core_.metrics().count_request("Ring", "OK");
                }
                maybe_finish(inner);
            });
        }
        job.cancelled = [this] { return cancelled_.load(); };
        job.done = [this, plan, arrived, template_request, step](step_outcome & outcome) {
            if (!outcome.ok) {
                std::unique_lock<std::recursive_mutex> inner(mutex_);
                settle(*step);
                fail(inner, error_status(outcome.error));
                return;
            }
            auto response = std::make_shared<pb::ForwardStreamResponse>();
            core_.complete(*plan, outcome, *response->mutable_forward(),
                [this, plan, arrived, template_request, response, step](const grpc::Status & status) {
                    on_step_answered(status, *plan, arrived, *template_request, *response, *step);
                });
        };
        lock.unlock();
        core_.steps().submit(std::move(job));
        lock.lock();
    }

    // A step's answer (or failure) is in: it no longer waits for the ring's token (the
    // caller holds the lock).
    void settle(const step_state & step) {
        --in_flight_;
        if (step.ring && core_.ring().forget(step.key, step.position)) {
            --ring_waiting_;
        }
    }

    // The loop's next step after `step` (fed `previous`), which answered `tokens` (one,
    // or a speculative step's accepted drafts and one more), unless the loop is done or
    // another path went on already; true when it went on.
    bool advance(std::unique_lock<std::recursive_mutex> & lock, const output_plan & plan,
                 const pb::ForwardRequest & previous, step_state & step, std::vector<int32_t> tokens) {
        if (step.advanced) {
            return false;
        }
        step.advanced = true;
        const auto & stops = previous.stop_token_ids();
        const auto stop = std::find_first_of(tokens.begin(), tokens.end(), stops.begin(), stops.end());
        // The step may answer at most what was left (its drafts were cut to fit).
        const int64_t left = static_cast<int64_t>(plan.continue_tokens) + 1 - static_cast<int64_t>(tokens.size());
        if (tokens.empty() || stop != tokens.end() || left <= 0 || cancelled_ || finishing_) {
            return false;
        }
        // What the stages keep of the step: all it was fed, or after a verification its
        // first token and the drafts that held; they drop the rest (the rejected drafts)
        // before the next step.
        const bool    verified = previous.output().kind() == pb::OUTPUT_KIND_VERIFIED;
        const int64_t held     = previous.n_past() + previous.tokens_size();
        const int64_t n_past   = verified ? previous.n_past() + static_cast<int64_t>(tokens.size()) : held;
        std::vector<int32_t> drafts;
        if (step.drafter) {
            step.drafter->answered({previous.tokens().begin(), previous.tokens().end()}, tokens);
            const int64_t room = std::min<int64_t>(left - 1, core_.n_ctx() - n_past - 1);
            drafts = step.drafter->next(static_cast<int>(std::max<int64_t>(room, 0)));
        }
        pb::ForwardRequest next = previous;
        next.set_n_past(n_past);
        next.clear_positions();
        next.clear_tokens();
        next.add_tokens(tokens.back());
        next.mutable_tokens()->Add(drafts.begin(), drafts.end());
        for (int64_t i = 0; i < next.tokens_size(); ++i) {
            next.add_positions(static_cast<int32_t>(n_past + i));
        }
        if (held > n_past) {
            next.set_discard_from(n_past);
        } else {
            next.clear_discard_from(); // the first step dropped what there was to drop
        }
        next.mutable_output()->clear_rows();
        next.mutable_output()->set_kind(drafts.empty() ? pb::OUTPUT_KIND_SAMPLED : pb::OUTPUT_KIND_VERIFIED);
        next.set_continue_tokens(static_cast<uint32_t>(left - 1));
        submit(lock, std::move(next), step.drafter);
        return true;
    }

    void on_step_answered(const grpc::Status & status, const output_plan & plan,
                          std::chrono::steady_clock::time_point arrived, const pb::ForwardRequest & previous,
                          pb::ForwardStreamResponse & response, step_state & step) {
        std::unique_lock<std::recursive_mutex> lock(mutex_);
        settle(step);
        if (!status.ok()) {
            fail(lock, status);
            return;
        }
        core_.record_served(*response.mutable_forward(), arrived);
        core_.metrics().count_request("ForwardStream", "OK");
        const auto & sampled = response.forward().sampled_tokens();
        // The next step first, then the answer: the engine starts while the token is
        // written to the caller, not after.
        advance(lock, plan, previous, step, {sampled.begin(), sampled.end()});
        held_.emplace(step.seq, std::move(response));
        while (!held_.empty() && held_.begin()->first == next_write_seq_) { // answers in the steps' order
            writes_.push(std::move(held_.begin()->second));
            held_.erase(held_.begin());
            ++next_write_seq_;
        }
        const bool more_coming = in_flight_ > 0;
        write_next(lock, more_coming);
        if (!more_coming) {
            start_next(lock);
        }
        maybe_finish(lock);
    }

    // `more_coming`: the decode loop goes on. Its answers then wait here until stream_flush
    // has passed since the last send, and go out together: each send (and its completion,
    // and the reader it wakes) takes CPU time from the engine's threads, which on a busy
    // stage slows every token (BENCHMARKS.md, worker design measurements). Any other
    // answer goes at once, with every answer held before it.
    void write_next(std::unique_lock<std::recursive_mutex> & lock, bool more_coming = false) {
        if (!more_coming || std::chrono::steady_clock::now() - last_send_ >= core_.stream_flush()) {
            due_ = writes_.waiting(); // everything queued goes now
        }
        send_due(lock);
    }

    // Writes the answers that are due, one at a time, as one send.
    void send_due(std::unique_lock<std::recursive_mutex> &) {
        due_ = std::min(due_, writes_.waiting());
        if (due_ == 0) {
            return;
        }
        pb::ForwardStreamResponse * next = writes_.next();
        if (next == nullptr) {
            return; // one in flight: OnWriteDone goes on
        }
        --due_;
        last_send_ = std::chrono::steady_clock::now();
        grpc::WriteOptions options;
        if (due_ > 0) {
            options.set_buffer_hint(); // the rest of this send follows: one flush for all
        }
        StartWrite(next, options);
    }

    // Ends the stream with `status` once what was produced has been written.
    void fail(std::unique_lock<std::recursive_mutex> & lock, const grpc::Status & status) {
        if (finishing_) {
            return;
        }
        finishing_ = true;
        final_status_ = status;
        pending_.clear();
        core_.metrics().count_answer("ForwardStream", status);
        write_next(lock); // answers held for the next send go first
        maybe_finish(lock);
    }

    void maybe_finish(std::unique_lock<std::recursive_mutex> &) {
        if (finished_ || in_flight_ > 0 || ring_waiting_ > 0 || !writes_.idle()) {
            return;
        }
        if (finishing_ || (reads_done_ && pending_.empty())) {
            finished_ = true;
            Finish(finishing_ ? final_status_ : grpc::Status::OK);
        }
    }

    stage_core &                          core_;
    pb::ForwardStreamRequest              request_;
    write_queue<pb::ForwardStreamResponse> writes_;
    static constexpr size_t               max_waiting_requests = 4;
    std::deque<pb::ForwardRequest>        pending_;
    bool                                  reading_ = false; // a StartRead is outstanding
    std::atomic<bool>                     cancelled_{false};
    // Recursive: a reaction the library runs inline from StartWrite/Finish must not
    // deadlock on the lock its caller holds.
    std::recursive_mutex                  mutex_;
    std::set<session_key>                 keys_;
    std::chrono::steady_clock::time_point last_send_;                // when a send last began
    size_t                                due_        = 0;     // queued answers to send now
    int                                   in_flight_    = 0; // steps (or their relays) not answered yet
    int                                   ring_waiting_ = 0; // of those, still waiting for the ring's token
    uint64_t                              next_seq_       = 0; // steps in the order they were submitted
    uint64_t                              next_write_seq_ = 0; // the step whose answer goes next
    std::map<uint64_t, pb::ForwardStreamResponse> held_;      // answers that came before an earlier one
    bool                                  reads_done_ = false;
    bool                                  finishing_  = false;
    bool                                  finished_   = false;
    grpc::Status                          final_status_;
};

} // namespace

grpc::ServerBidiReactor<pb::ForwardStreamRequest, pb::ForwardStreamResponse> * forward_stream_open(
    stage_core & core) {
    return new forward_stream_reactor(core);
}

} // namespace meshnet
