// relay_link.cpp - the Relay stream to the next stage: batches are registered when sent
// and answered when their response (matched by batch_id) arrives, or failed together
// when the stream ends.
#include "relay_link.h"
#include "write_queue.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

namespace meshnet {

namespace {

using link_clock = std::chrono::steady_clock;

std::vector<relay_answer> failed_answers(size_t n, const grpc::Status & status) {
    std::vector<relay_answer> answers(n);
    for (auto & answer : answers) {
        answer.status = status;
    }
    return answers;
}

} // namespace

// One Relay call. It holds the stream open (AddHold) so that batches can be written from
// the engine thread at any time; once broken it takes no batch, and its last callback
// (OnDone) fails the batches it still carried and deletes it.
class relay_link::stream final : public grpc::ClientBidiReactor<pb::RelayRequest, pb::RelayResponse> {
public:
    explicit stream(relay_link & link) : link_(link) {
        context_.set_wait_for_ready(true); // wait out a next stage that is (re)starting
        link_.stub_->async()->Relay(&context_, this);
        AddHold();
        StartRead(&response_);
        StartCall();
    }

    // Queues the batch; false (and `request` untouched) once the stream is broken.
    bool send(uint64_t id, pb::RelayRequest & request, size_t n_steps, relay_batch_done & done) {
        std::lock_guard<std::recursive_mutex> lock(mutex_);
        if (broken_) {
            return false;
        }
        in_flight_.emplace(id, batch{n_steps, std::move(done), link_clock::now()});
        writes_.push(std::move(request));
        write_next();
        return true;
    }

    // When the oldest batch still waiting was sent (`now` when none waits).
    link_clock::time_point oldest(link_clock::time_point now) {
        std::lock_guard<std::recursive_mutex> lock(mutex_);
        link_clock::time_point first = now;
        for (const auto & entry : in_flight_) {
            first = std::min(first, entry.second.sent);
        }
        return first;
    }

    // True once the stream can take no more batches (its read failed).
    bool broken() {
        std::lock_guard<std::recursive_mutex> lock(mutex_);
        return broken_;
    }

    // Lets the stream end: with a failure `why` it is cancelled and what it carried fails
    // with `why`, else it ends as it broke. Called once, by whoever detached it from the
    // link, without the link's lock: OnDone may follow at once. Touches nothing after.
    void release(const grpc::Status & why) {
        bool remove_hold = false;
        {
            std::lock_guard<std::recursive_mutex> lock(mutex_);
            if (!why.ok()) {
                ending_status_ = why;
            }
            broken_     = true;
            remove_hold = std::exchange(held_, false);
        }
        if (!why.ok()) {
            context_.TryCancel();
        }
        if (remove_hold) {
            RemoveHold();
        }
    }

    void OnWriteDone(bool ok) override {
        std::lock_guard<std::recursive_mutex> lock(mutex_);
        writes_.done();
        if (ok) {
            write_next();
        } // a failed write ends the stream: the pending read fails next, and breaks it
    }

    void OnReadDone(bool ok) override {
        if (!ok) { // the stream is over; the link's watchdog detaches and releases it
            {
                std::lock_guard<std::recursive_mutex> lock(mutex_);
                broken_ = true;
            }
            link_.changed_.notify_all();
            return;
        }
        const uint64_t id = response_.batch_id();
        auto results = std::move(*response_.mutable_results());
        response_.Clear();
        batch answered;
        bool  found = false;
        {
            std::lock_guard<std::recursive_mutex> lock(mutex_);
            auto it = in_flight_.find(id);
            if (it != in_flight_.end()) {
                answered = std::move(it->second);
                in_flight_.erase(it);
                found = true;
            }
        }
        if (!found) {
            StartRead(&response_);
            return; // not ours (never sent on this stream): nothing waits for it
        }
        std::vector<relay_answer> answers(answered.n_steps);
        for (size_t i = 0; i < answered.n_steps; ++i) {
            if (i >= static_cast<size_t>(results.size())) {
                answers[i].status = grpc::Status(grpc::StatusCode::INTERNAL,
                    "the next stage answered " + std::to_string(results.size()) + " of " +
                    std::to_string(answered.n_steps) + " relayed steps");
                continue;
            }
            pb::RelayResult & result = results[static_cast<int>(i)];
            if (result.code() == 0) {
                answers[i].response = std::move(*result.mutable_forward());
            } else {
                answers[i].status = grpc::Status(static_cast<grpc::StatusCode>(result.code()), result.message(),
                                                 result.details());
            }
        }
        answered.done(answers); // the waiting steps first, then the next read
        StartRead(&response_);
    }

    void OnDone(const grpc::Status & status) override {
        grpc::Status why = ending_status_.ok()
            ? (status.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the next stage ended the relay stream")
                           : status)
            : ending_status_;
        for (auto & entry : in_flight_) {
            auto answers = failed_answers(entry.second.n_steps, why);
            entry.second.done(answers);
        }
        relay_link & link = link_;
        delete this;
        link.stream_done();
    }

private:
    struct batch {
        size_t                 n_steps = 0;
        relay_batch_done       done;
        link_clock::time_point sent;
    };

    void write_next() { // the caller holds mutex_
        if (pb::RelayRequest * next = writes_.next()) {
            StartWrite(next);
        }
    }

    relay_link &                     link_;
    grpc::ClientContext              context_;
    pb::RelayResponse                response_;
    write_queue<pb::RelayRequest>    writes_;
    std::map<uint64_t, batch>        in_flight_;
    grpc::Status                     ending_status_; // set when we end the stream ourselves
    // Recursive: gRPC may run a reaction inline from StartWrite while we hold the lock.
    std::recursive_mutex             mutex_;
    bool                             broken_ = false;
    bool                             held_   = true;
};

relay_link::relay_link(std::shared_ptr<grpc::Channel> channel, std::chrono::milliseconds deadline)
    : stub_(pb::ShardService::NewStub(std::move(channel))), deadline_(deadline),
      watchdog_([this] { watch_streams(); }) {}

relay_link::~relay_link() {
    std::unique_lock<std::mutex> lock(mutex_);
    stopping_ = true;
    stream * open = std::exchange(current_, nullptr);
    changed_.notify_all();
    lock.unlock();
    if (open) {
        open->release(grpc::Status(grpc::StatusCode::CANCELLED, "the worker is shutting down"));
    }
    watchdog_.join();
    lock.lock();
    changed_.wait(lock, [this] { return live_streams_ == 0; });
}

void relay_link::send(std::vector<pb::ForwardRequest> steps, relay_batch_done done) {
    const size_t n_steps = steps.size();
    pb::RelayRequest request;
    for (auto & step : steps) {
        request.add_steps()->Swap(&step);
    }
    std::vector<stream *> broken; // detached here, released once the lock is let go
    bool sent = false, stopping = false;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        request.set_batch_id(next_batch_++);
        stopping = stopping_;
        // A stream found broken is replaced; a new one that breaks at once, only once.
        for (int attempt = 0; attempt < 2 && !stopping && !sent; ++attempt) {
            if (current_ != nullptr && current_->broken()) {
                broken.push_back(std::exchange(current_, nullptr));
            }
            if (current_ == nullptr) {
                ++live_streams_;
                current_ = new stream(*this);
            }
            sent = current_->send(request.batch_id(), request, n_steps, done);
        }
    }
    for (stream * ended : broken) {
        ended->release(grpc::Status::OK);
    }
    if (!sent) {
        auto answers = failed_answers(n_steps, stopping
            ? grpc::Status(grpc::StatusCode::CANCELLED, "the worker is shutting down")
            : grpc::Status(grpc::StatusCode::UNAVAILABLE, "the relay stream to the next stage broke twice"));
        done(answers);
    }
}

void relay_link::stream_done() {
    std::lock_guard<std::mutex> lock(mutex_);
    --live_streams_;
    changed_.notify_all();
}

void relay_link::watch_streams() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
        changed_.wait_for(lock, std::chrono::milliseconds(100));
        if (stopping_ || current_ == nullptr) {
            continue;
        }
        grpc::Status why; // OK: it broke by itself
        const auto now = link_clock::now();
        if (!current_->broken()) {
            if (now - current_->oldest(now) <= deadline_) {
                continue;
            }
            why = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                "the next stage did not answer a relayed step within " +
                std::to_string(deadline_.count() / 1000) + " s");
        }
        stream * ended = std::exchange(current_, nullptr);
        lock.unlock();
        ended->release(why);
        lock.lock();
    }
}

} // namespace meshnet
