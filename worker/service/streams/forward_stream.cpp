// forward_stream.cpp - the ForwardStream reactor: one stream of steps, answered in order,
// and the first stage's decode loop (plain or speculative) that it runs by itself; the
// loop's windows and the answers' order are loop_windows'.
#include "forward_stream.h"
#include "loop_windows.h"
#include "proto_convert.h"
#include "write_queue.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <set>
#include <vector>

namespace meshnet {

namespace {

// One stream of steps, answered in order; cancelling it releases its sessions. A step
// with continue_tokens runs a decode loop here: every sampled token is answered and fed
// back in as the next step until the count, a stop token, an error or a cancellation; a
// speculative loop keeps its verify windows in flight as its decode_loop says.
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
        // Checked as it comes: a refused request waits its turn as its error alone, so
        // that streams cannot pile up requests that will be refused (many large ones
        // took GBs). What was read goes: a message keeps its fields' memory when cleared.
        waiting next;
        next.refused = core_.check(request_.forward(), /*streaming =*/ true);
        if (!next.refused) {
            next.request.Swap(request_.mutable_forward());
        }
        pb::ForwardStreamRequest().Swap(&request_);
        refused_waiting_ = refused_waiting_ || next.refused.has_value();
        pending_.push_back(std::move(next));
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
        waiting next = std::move(pending_.front());
        pending_.pop_front();
        if (next.refused) { // the stream ends at it, after the answers before it
            fail(lock, error_status(*next.refused));
            return;
        }
        read_more();
        submit_request(lock, std::move(next.request));
    }

    // Reads the next request unless enough wait already: a client that sends faster than
    // the steps run is held back by the transport's flow control, so what one stream
    // holds here stays bounded (the caller holds the lock).
    void read_more() {
        if (finishing_ || reads_done_ || reading_ || refused_waiting_ || pending_.size() >= max_waiting_requests) {
            return;
        }
        reading_ = true;
        StartRead(&request_);
    }

    // One step of the stream: its place in the answers' order, and whether its tokens
    // reached its loop yet (by the ring or the answer, whichever came first).
    struct step_state {
        uint64_t            seq    = 0;     // its place in order_
        session_key         key;
        uint64_t            window = 0;     // ForwardRequest.window: the ring's key
        bool                ring   = false; // waits for the ring's token too
        bool                heard  = false; // its tokens reached the loop
        uint32_t            depth  = 1;     // its loop's windows in flight when it was sent
        std::shared_ptr<decode_loop> loop;  // null outside a decode loop
    };

    // A caller's step: a decode loop's first window when it continues, else a step alone.
    void submit_request(std::unique_lock<std::recursive_mutex> & lock, pb::ForwardRequest request) {
        if (request.continue_tokens() == 0) {
            submit(lock, std::move(request), nullptr);
            return;
        }
        const auto & identity = core_.identity();
        const loop_limits limits = loop_limits_for(request, {identity.max_loop_drafts, identity.max_loop_windows,
                                                             identity.exact.step_rows, core_.n_ctx(),
                                                             core_.info().discard_depth});
        auto loop = std::make_shared<decode_loop>(request, limits, next_window_++);
        submit(lock, std::move(request), loop);
        run_loop(lock, loop);
    }

    // Submits the windows the loop's pipeline has room for, in order.
    void run_loop(std::unique_lock<std::recursive_mutex> & lock, const std::shared_ptr<decode_loop> & loop) {
        while (!cancelled_ && !finishing_) {
            std::optional<pb::ForwardRequest> next = loop->next();
            if (!next) {
                return;
            }
            submit(lock, std::move(*next), loop);
        }
    }

    // Queues one step on the engine (the caller holds the lock, which it keeps: a loop's
    // windows must reach the scheduler in the order the pipeline made them).
    void submit(std::unique_lock<std::recursive_mutex> & lock, pb::ForwardRequest request,
                std::shared_ptr<decode_loop> loop) {
        auto step     = std::make_shared<step_state>();
        auto response = std::make_shared<pb::ForwardStreamResponse>();
        step_call call;
        call.streaming = true;
        call.cancelled = [this] { return cancelled_.load(); };
        call.response  = response->mutable_forward();
        call.then      = [this, response, step](const grpc::Status & status) {
            on_step_answered(status, *response, step);
        };
        // Set up before the step is queued: its tokens may come over the ring first.
        const auto before_queue = [&](bool rides_ring) {
            ++in_flight_;
            step->key    = key_of(request.key());
            step->window = request.window();
            step->ring   = loop && rides_ring;
            step->loop   = loop;
            step->seq    = order_.queued(loop ? step->window : 0);
            keys_.insert(step->key);
            if (step->loop) {
                step->depth = static_cast<uint32_t>(step->loop->in_flight());
            }
            if (step->ring) {
                ++ring_waiting_;
                core_.ring().expect(step->key, step->window, [this, step](window_tokens tokens) {
                    std::unique_lock<std::recursive_mutex> inner(mutex_);
                    --ring_waiting_;
                    if (heard(inner, *step, std::move(tokens))) {
                        core_.metrics().count_request("Ring", "OK");
                    }
                    maybe_finish(inner);
                });
            }
        };
        if (auto error = core_.submit(request, std::move(call), before_queue)) {
            fail(lock, error_status(*error));
        }
    }

    // A step's answer (or failure) is in: it no longer waits for the ring's token (the
    // caller holds the lock).
    void settle(const step_state & step) {
        --in_flight_;
        if (step.ring && core_.ring().forget(step.key, step.window)) {
            --ring_waiting_;
        }
    }

    // A loop's step answered `tokens` (one, or a speculative step's accepted drafts and one
    // more, and the last stage's drafts for the next window), by the ring or its answer: the
    // loop learns which of its windows are its text and which are dropped, and goes on.
    // True when these were the step's first tokens.
    bool heard(std::unique_lock<std::recursive_mutex> & lock, step_state & step, window_tokens tokens) {
        if (step.heard || !step.loop) {
            return false;
        }
        step.heard = true;
        const std::shared_ptr<decode_loop> loop = step.loop;
        for (const auto & [window, text] : loop->answered(step.window, std::move(tokens.tokens),
                                                          std::move(tokens.next_drafts))) {
            order_.decide(window, text);
        }
        // The next windows first, then the answers: the engine starts while they are written.
        run_loop(lock, loop);
        write_ready(lock);
        return true;
    }

    void on_step_answered(const grpc::Status & status, pb::ForwardStreamResponse & response,
                          const std::shared_ptr<step_state> & step) {
        std::unique_lock<std::recursive_mutex> lock(mutex_);
        settle(*step);
        // A window its loop already dropped is void whatever its answer: the stages skip
        // such windows (STEP_SUPERSEDED) once the step after the rejection reaches them.
        if (!status.ok() && !order_.dropped(step->seq)) {
            fail(lock, status);
            return;
        }
        window_tokens tokens;
        if (status.ok()) {
            core_.metrics().count_request("ForwardStream", "OK");
            if (step->loop) {
                response.mutable_forward()->set_loop_depth(step->depth);
            }
            const auto & answer = response.forward();
            tokens = {{answer.sampled_tokens().begin(), answer.sampled_tokens().end()},
                      {answer.next_drafts().begin(), answer.next_drafts().end()}};
        }
        held_.emplace(step->seq, std::move(response));
        order_.answered(step->seq);
        heard(lock, *step, std::move(tokens));
        write_ready(lock);
        if (in_flight_ == 0) {
            start_next(lock);
        }
        maybe_finish(lock);
    }

    // Queues the answers that are due in the steps' order: a loop's answer once its loop
    // knows whether it is its text (a dropped window's answer is never sent).
    void write_ready(std::unique_lock<std::recursive_mutex> & lock) {
        for (const auto & [seq, text] : order_.due()) {
            auto held = held_.extract(seq);
            if (text) {
                writes_.push(std::move(held.mapped()));
            }
        }
        write_next(lock, in_flight_ > 0);
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
    struct waiting {
        pb::ForwardRequest         request;
        std::optional<shard_error> refused; // the request is gone: its turn fails the stream
    };
    std::deque<waiting>                   pending_;
    bool                                  refused_waiting_ = false; // no read after a refusal
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
    uint64_t                              next_window_    = 1; // a loop's window numbers, stream-wide
    answer_order                          order_;     // the steps in the order their answers go
    std::map<uint64_t, pb::ForwardStreamResponse> held_; // answers not written yet, by step
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
