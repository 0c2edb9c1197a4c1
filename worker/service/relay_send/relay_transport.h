// relay_transport.h - what carries a relay_link's batches to the next stage: one
// interface (relay_link::stream) and its two kinds, a gRPC Relay call and a local relay
// connection. Each registers the batches it sends in a relay_inflight, answers them as
// responses arrive and fails the rest when it ends. Only relay_link uses these.
#pragma once

#include "relay_inflight.h"
#include "relay_link.h"
#include "write_queue.h"

#include <grpcpp/client_context.h>
#include <grpcpp/support/client_callback.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>

namespace meshnet {

// What both kinds of stream share: the batches in flight, and whether the stream can
// take more. A stream goes once it is over and released (release(), by whoever detached
// it from the link): a gRPC stream deletes itself in its last callback, the link deletes
// a local one after joining its reader.
class relay_link::stream {
public:
    explicit stream(relay_link & link) : link_(link) {}
    virtual ~stream() = default;
    stream(const stream &) = delete;
    stream & operator=(const stream &) = delete;

    // Sends the batch; false (and `request` untouched) once the stream is broken. The
    // caller holds the link's lock, so batches go out one at a time, in order.
    bool send(uint64_t id, pb::RelayRequest & request, size_t n_steps, relay_batch_done & done);

    // When the oldest batch still waiting was sent (`now` when none waits).
    relay_inflight::clock::time_point oldest(relay_inflight::clock::time_point now) const {
        return in_flight_.oldest(now);
    }

    // True once the stream can take no more batches.
    bool broken();

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
    explicit grpc_stream(relay_link & link);

    bool local() const override { return false; }
    void release(const grpc::Status & why) override;
    bool retire_if_idle() override;

    void OnWriteDone(bool ok) override;
    void OnReadDone(bool ok) override;
    void OnDone(const grpc::Status & status) override;

protected:
    void write(pb::RelayRequest & request) override;

private:
    void write_next(); // the caller holds mutex_
    // A retired stream half-closes once its last write is out: the next stage answers
    // what it holds (nothing) and ends the call, which ends this stream.
    void writes_done_if_idle(); // the caller holds mutex_

    grpc::ClientContext           context_;
    pb::RelayResponse             response_;
    write_queue<pb::RelayRequest> writes_;
    bool                          held_        = true;
    bool                          retiring_    = false;
    bool                          writes_done_ = false;
};

// The stream over a local relay connection: batches are written by the sending thread
// (the engine thread), answers read by a thread of the stream's own, which the link
// joins before it deletes the stream (relay_link::reap_finished).
class relay_link::local_stream final : public relay_link::stream {
public:
    local_stream(relay_link & link, int fd);

    bool local() const override { return true; }
    void release(const grpc::Status & why) override;
    void join_reader() { reader_.join(); }

protected:
    void write(pb::RelayRequest & request) override;

private:
    void read_answers();

    const int                   fd_;
    std::condition_variable_any released_cv_;
    bool                        released_ = false;
    std::thread                 reader_; // last: it starts once the rest is set up
};

} // namespace meshnet
