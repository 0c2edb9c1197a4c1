// relay_link.cpp - the Relay stream to the next stage: batches are registered when sent
// and answered when their response (matched by batch_id) arrives, or failed together
// when the stream ends (relay_inflight). The stream is a gRPC call, or a local relay
// connection.
#include "relay_link.h"
#include "relay_frames.h"
#include "write_queue.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace meshnet {

namespace {

using link_clock = std::chrono::steady_clock;

// How long a release of an orphaned session may take at the next stage.
constexpr std::chrono::seconds release_deadline{5};

// A next stage that stops reading fails the write after this long (the stream breaks).
constexpr int local_send_timeout_ms = 10000;
// How often the link asks a next stage that did not answer about its local relay, and
// how long it waits for the answer (it runs on the watchdog, not the engine thread).
constexpr std::chrono::seconds      probe_every{1};
constexpr std::chrono::milliseconds probe_deadline{500};

} // namespace

// What both kinds of stream share: the batches in flight, answered by batch_id, and
// failed together when the stream is over. A stream deletes itself once it is over and
// released (release(), by whoever detached it from the link).
class relay_link::stream {
public:
    explicit stream(relay_link & link) : link_(link) {}
    virtual ~stream() = default;
    stream(const stream &) = delete;
    stream & operator=(const stream &) = delete;

    // Sends the batch; false (and `request` untouched) once the stream is broken. The
    // caller holds the link's lock, so batches go out one at a time, in order.
    bool send(uint64_t id, pb::RelayRequest & request, size_t n_steps, relay_batch_done & done) {
        {
            std::lock_guard<std::recursive_mutex> lock(mutex_);
            if (broken_) {
                return false;
            }
            in_flight_.add(id, n_steps, std::move(done));
        }
        write(request);
        return true;
    }

    // When the oldest batch still waiting was sent (`now` when none waits).
    link_clock::time_point oldest(link_clock::time_point now) const { return in_flight_.oldest(now); }

    // True once the stream can take no more batches.
    bool broken() {
        std::lock_guard<std::recursive_mutex> lock(mutex_);
        return broken_;
    }

    virtual bool local() const = 0;

    // Lets the stream end: with a failure `why` it is cancelled and what it carried fails
    // with `why`, else it ends as it broke. Called once, without the link's lock: the
    // stream may be gone when it returns.
    virtual void release(const grpc::Status & why) = 0;

    // Ends the stream without failing anything if no batch is in flight (the link moves
    // to the local relay); false when it cannot.
    virtual bool retire_if_idle() { return false; }

protected:
    // Puts the request on the wire (or breaks the stream trying).
    virtual void write(pb::RelayRequest & request) = 0;

    relay_link &         link_;
    std::recursive_mutex mutex_; // recursive: gRPC may run a reaction inline while it is held
    relay_inflight       in_flight_;
    bool                 broken_ = false;
};

// One Relay call. It holds the stream open (AddHold) so that batches can be written from
// the engine thread at any time; once broken it takes no batch, and its last callback
// (OnDone) fails the batches it still carried and deletes it.
class relay_link::grpc_stream final : public relay_link::stream,
                                      public grpc::ClientBidiReactor<pb::RelayRequest, pb::RelayResponse> {
public:
    explicit grpc_stream(relay_link & link) : stream(link) {
        context_.set_wait_for_ready(true); // wait out a next stage that is (re)starting
        link_.stub_->async()->Relay(&context_, this);
        AddHold();
        StartRead(&response_);
        StartCall();
    }

    bool local() const override { return false; }

    void release(const grpc::Status & why) override {
        bool remove_hold = false;
        {
            std::lock_guard<std::recursive_mutex> lock(mutex_);
            if (!why.ok()) {
                in_flight_.set_ending_status(why);
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

    bool retire_if_idle() override {
        std::lock_guard<std::recursive_mutex> lock(mutex_);
        if (broken_ || !in_flight_.empty()) {
            return false;
        }
        broken_   = true;
        retiring_ = true;
        writes_done_if_idle();
        return true;
    }

    void OnWriteDone(bool ok) override {
        std::lock_guard<std::recursive_mutex> lock(mutex_);
        writes_.done();
        if (ok) {
            write_next();
            writes_done_if_idle();
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
        in_flight_.answer(response_); // the waiting steps first, then the next read
        response_.Clear();
        StartRead(&response_);
    }

    void OnDone(const grpc::Status & status) override {
        in_flight_.fail_all(status.ok()
            ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the next stage ended the relay stream")
            : status);
        relay_link & link = link_;
        delete this;
        link.stream_done();
    }

protected:
    void write(pb::RelayRequest & request) override {
        std::lock_guard<std::recursive_mutex> lock(mutex_);
        writes_.push(std::move(request));
        write_next();
    }

private:
    void write_next() { // the caller holds mutex_
        if (pb::RelayRequest * next = writes_.next()) {
            StartWrite(next);
        }
    }

    // A retired stream half-closes once its last write is out: the next stage answers
    // what it holds (nothing) and ends the call, which ends this stream.
    void writes_done_if_idle() { // the caller holds mutex_
        if (retiring_ && writes_.idle() && !writes_done_) {
            writes_done_ = true;
            StartWritesDone();
        }
    }

    grpc::ClientContext           context_;
    pb::RelayResponse             response_;
    write_queue<pb::RelayRequest> writes_;
    bool                          held_        = true;
    bool                          retiring_    = false;
    bool                          writes_done_ = false;
};

// The stream over a local relay connection: batches are written by the sending thread
// (the engine thread), answers read by a thread of the stream's own.
class relay_link::local_stream final : public relay_link::stream {
public:
    local_stream(relay_link & link, int fd) : stream(link), fd_(fd) {
        std::thread([this] { read_answers(); }).detach(); // it deletes the stream at its end
    }

    bool local() const override { return true; }

    void release(const grpc::Status & why) override {
        {
            std::lock_guard<std::recursive_mutex> lock(mutex_);
            if (!why.ok()) {
                in_flight_.set_ending_status(why);
            }
            broken_   = true;
            released_ = true;
        }
        shutdown(fd_, SHUT_RDWR); // the reader ends, if it has not yet
        released_cv_.notify_all();
    }

protected:
    void write(pb::RelayRequest & request) override {
        if (!write_frame(fd_, request)) {
            shutdown(fd_, SHUT_RDWR); // the reader sees the end and breaks the stream
        }
    }

private:
    void read_answers() {
        pb::RelayResponse response;
        while (read_frame(fd_, response, SIZE_MAX)) {
            in_flight_.answer(response);
            response.Clear();
        }
        {
            std::lock_guard<std::recursive_mutex> lock(mutex_);
            broken_ = true;
        }
        link_.changed_.notify_all(); // the watchdog detaches and releases it
        {
            std::unique_lock<std::recursive_mutex> lock(mutex_);
            released_cv_.wait(lock, [this] { return released_; });
        }
        in_flight_.fail_all(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the next stage ended the local relay connection"));
        close(fd_);
        relay_link & link = link_;
        delete this;
        link.stream_done();
    }

    const int                   fd_;
    std::condition_variable_any released_cv_;
    bool                        released_ = false;
};

relay_link::relay_link(std::shared_ptr<grpc::Channel> channel, std::chrono::milliseconds deadline, bool try_local)
    : stub_(pb::ShardService::NewStub(std::move(channel))), deadline_(deadline), try_local_(try_local),
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
                if (current_->local()) {
                    forget_local_relay();
                }
                broken.push_back(std::exchange(current_, nullptr));
            }
            if (current_ == nullptr) {
                std::string error;
                int fd = local_port_ != 0 ? connect_loopback(local_port_, local_send_timeout_ms, error) : -1;
                if (fd >= 0 && !write_token(fd, local_token_)) {
                    close(fd);
                    fd = -1;
                }
                if (local_port_ != 0 && fd < 0) {
                    forget_local_relay();
                }
                ++live_streams_;
                current_ = fd >= 0 ? static_cast<stream *>(new local_stream(*this, fd)) : new grpc_stream(*this);
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

void relay_link::release(const pb::RouteKey & key) {
    struct call {
        grpc::ClientContext        context;
        pb::ReleaseSessionRequest  request;
        pb::ReleaseSessionResponse response;
    };
    auto * pending = new call;
    pending->context.set_deadline(std::chrono::system_clock::now() + release_deadline);
    pending->context.set_wait_for_ready(true); // a next stage that is restarting gets it too
    *pending->request.mutable_key() = key;
    // Best effort: a next stage that is gone holds nothing, and one that stays silent
    // evicts the idle session itself.
    stub_->async()->ReleaseSession(&pending->context, &pending->request, &pending->response,
                                   [pending](const grpc::Status &) { delete pending; });
}

void relay_link::forget_local_relay() {
    local_port_ = 0;   // the next stage may have restarted on another port, or without one:
    probe_due_  = true; // gRPC until it says again
}

void relay_link::stream_done() {
    std::lock_guard<std::mutex> lock(mutex_);
    --live_streams_;
    changed_.notify_all();
}

void relay_link::probe_local(std::unique_lock<std::mutex> & lock) {
    const auto now = link_clock::now();
    if (try_local_ && local_port_ == 0 && probe_due_ && now - last_probe_ >= probe_every) {
        last_probe_ = now;
        lock.unlock();
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + probe_deadline);
        pb::GetInfoRequest  request;
        pb::GetInfoResponse info;
        const grpc::Status status = stub_->GetInfo(&context, request, &info);
        lock.lock();
        if (!status.ok()) {
            return; // not up (yet): ask again later
        }
        probe_due_  = false;
        local_port_  = static_cast<int>(info.local_relay_port());
        local_token_ = info.local_relay_token();
    }
    if (local_port_ != 0 && current_ != nullptr && !current_->local() && current_->retire_if_idle()) {
        stream * retired = std::exchange(current_, nullptr); // the next batch connects locally
        lock.unlock();
        retired->release(grpc::Status::OK);
        lock.lock();
    }
}

void relay_link::watch_streams() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
        changed_.wait_for(lock, std::chrono::milliseconds(100));
        if (stopping_) {
            continue;
        }
        probe_local(lock);
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
        if (current_->local()) {
            forget_local_relay();
        }
        stream * ended = std::exchange(current_, nullptr);
        lock.unlock();
        ended->release(why);
        lock.lock();
    }
}

} // namespace meshnet
