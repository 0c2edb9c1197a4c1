// relay_link.cpp - the link to the next stage: which stream new batches go to (a gRPC
// call, or a local relay connection once the next stage offers one: relay_transport.h),
// replacing a broken one, and the watchdog that ends a stream past its deadline.
#include "relay_link.h"
#include "boundary_packing.h"
#include "relay_frames.h"
#include "relay_transport.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
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

relay_link::relay_link(std::shared_ptr<grpc::Channel> channel, std::chrono::milliseconds deadline, route_key key,
                       bool try_local, boundary_encoding compress)
    : stub_(pb::ShardService::NewStub(std::move(channel))), deadline_(deadline), key_(std::move(key)),
      try_local_(try_local && key_.present()), compress_(compress), watchdog_([this] { watch_streams(); }) {}

void relay_link::authenticate(grpc::ClientContext & context) const {
    if (key_.present()) {
        context.AddMetadata(route_auth_metadata, key_.proof());
    }
}

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
    while (live_streams_ > 0) {
        changed_.wait(lock, [this] { return live_streams_ == 0 || !finished_.empty(); });
        reap_finished(lock);
    }
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
                forget_next_stage(current_->local());
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
    authenticate(pending->context);
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

void relay_link::forget_next_stage(bool local) {
    if (local) {
        forget_local_relay();
    }
    if (compress_ != boundary_encoding::raw) {
        probe_due_ = true; // a restarted next stage may take other encodings: ask again
    }
}

void relay_link::stream_done() {
    std::lock_guard<std::mutex> lock(mutex_);
    --live_streams_;
    changed_.notify_all();
}

void relay_link::reader_finished(local_stream * ended) {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_.push_back(ended);
    changed_.notify_all();
}

void relay_link::reap_finished(std::unique_lock<std::mutex> & lock) {
    std::vector<local_stream *> ended = std::exchange(finished_, {});
    if (ended.empty()) {
        return;
    }
    lock.unlock();
    for (local_stream * done : ended) {
        done->join_reader();
        delete done;
    }
    lock.lock();
    live_streams_ -= static_cast<int>(ended.size());
    changed_.notify_all();
}

void relay_link::probe_local(std::unique_lock<std::mutex> & lock) {
    const auto now = link_clock::now();
    const bool wanted = (try_local_ && local_port_ == 0) || compress_ != boundary_encoding::raw;
    if (wanted && probe_due_ && now - last_probe_ >= probe_every) {
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
        probe_due_ = false;
        if (try_local_) {
            local_port_  = static_cast<int>(info.local_relay_port());
            local_token_ = key_.local_relay_token(info.incarnation()); // what that incarnation expects
        }
        const auto & taken = info.boundary_encodings();
        taken_ = compress_ != boundary_encoding::raw &&
                 std::find(taken.begin(), taken.end(), encoding_to_pb(compress_)) != taken.end();
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
        reap_finished(lock);
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
        forget_next_stage(current_->local());
        stream * ended = std::exchange(current_, nullptr);
        lock.unlock();
        ended->release(why);
        lock.lock();
    }
}

} // namespace meshnet
