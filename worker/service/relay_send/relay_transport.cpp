// relay_transport.cpp - see relay_transport.h.
#include "relay_transport.h"
#include "relay_frames.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <thread>
#include <utility>

namespace meshnet {

bool relay_link::stream::send(uint64_t id, pb::RelayRequest & request, size_t n_steps, relay_batch_done & done) {
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

bool relay_link::stream::broken() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    return broken_;
}

relay_link::grpc_stream::grpc_stream(relay_link & link) : stream(link) {
    context_.set_wait_for_ready(true); // wait out a next stage that is (re)starting
    link_.authenticate(context_);
    link_.stub_->async()->Relay(&context_, this);
    AddHold();
    StartRead(&response_);
    StartCall();
}

void relay_link::grpc_stream::release(const grpc::Status & why) {
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

bool relay_link::grpc_stream::retire_if_idle() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    if (broken_ || !in_flight_.empty()) {
        return false;
    }
    broken_   = true;
    retiring_ = true;
    writes_done_if_idle();
    return true;
}

void relay_link::grpc_stream::OnWriteDone(bool ok) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    writes_.done();
    if (ok) {
        write_next();
        writes_done_if_idle();
    } // a failed write ends the stream: the pending read fails next, and breaks it
}

void relay_link::grpc_stream::OnReadDone(bool ok) {
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

void relay_link::grpc_stream::OnDone(const grpc::Status & status) {
    in_flight_.fail_all(status.ok()
        ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the next stage ended the relay stream")
        : status);
    relay_link & link = link_;
    delete this;
    link.stream_done();
}

void relay_link::grpc_stream::write(pb::RelayRequest & request) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    writes_.push(std::move(request));
    write_next();
}

void relay_link::grpc_stream::write_next() {
    if (pb::RelayRequest * next = writes_.next()) {
        StartWrite(next);
    }
}

void relay_link::grpc_stream::writes_done_if_idle() {
    if (retiring_ && writes_.idle() && !writes_done_) {
        writes_done_ = true;
        StartWritesDone();
    }
}

relay_link::local_stream::local_stream(relay_link & link, int fd)
    : stream(link), fd_(fd), reader_([this] { read_answers(); }) {}

void relay_link::local_stream::release(const grpc::Status & why) {
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

void relay_link::local_stream::write(pb::RelayRequest & request) {
    if (!write_frame(fd_, request)) {
        shutdown(fd_, SHUT_RDWR); // the reader sees the end and breaks the stream
    }
}

void relay_link::local_stream::read_answers() {
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
    link_.reader_finished(this); // the link joins this thread, then deletes the stream
}

} // namespace meshnet
