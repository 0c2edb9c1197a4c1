// relay_link.h - a chain stage's link to its --next-stage: one long-lived Relay stream
// that carries the relayed steps of each engine step as one message and hands each
// batch's answers back. A broken stream fails what it carried; the next batch opens a
// new stream, which waits out a next stage that is (re)starting. A next stage on this
// host that offers the local relay (GetInfo local_relay_port) gets the stream over a
// plain loopback socket instead of gRPC, once the link has asked it. A link told to
// compress learns the same way whether the next stage takes the encoding.
#pragma once

#include "boundary_compression.h"
#include "relay_inflight.h"
#include "route_key.h"

#include "meshnet/shard/v1/shard_service.grpc.pb.h"

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace meshnet {

namespace pb = ::meshnet::shard::v1;

class relay_link {
public:
    // A batch the next stage has not answered within `deadline` fails with
    // DEADLINE_EXCEEDED, and so does the rest of its stream. With `try_local` (the next
    // stage is on 127.0.0.1 and the link has no TLS), the link asks the next stage for its
    // local relay and uses it when offered.
    // `key`: the route key, proved on every call to the next stage and the source of its
    // local relay's token (absent: calls carry no proof, and try_local is ignored).
    // `compress`: the encoding this link packs boundaries in once the next stage says it takes
    // it (the caller has already ruled out loopback).
    relay_link(std::shared_ptr<grpc::Channel> channel, std::chrono::milliseconds deadline,
               route_key key = {}, bool try_local = false,
               boundary_encoding compress = boundary_encoding::raw);
    ~relay_link(); // cancels the stream: what it carried fails with CANCELLED

    relay_link(const relay_link &) = delete;
    relay_link & operator=(const relay_link &) = delete;

    void send(std::vector<pb::ForwardRequest> steps, relay_batch_done done);

    // The encoding boundaries sent now should be packed in: `compress` once the next stage
    // (as last asked) takes it, raw before and otherwise.
    boundary_encoding encoding() const { return taken_ ? compress_ : boundary_encoding::raw; }

    // Frees the session at the next stage (ReleaseSession, not waited for; it goes on
    // down the chain from there).
    void release(const pb::RouteKey & key);

private:
    class stream;
    class grpc_stream;
    class local_stream;

    void stream_done(); // a stream's last callback ran: it is gone
    // A local stream's reader thread has ended: the watchdog (or, at the end, the
    // destructor) joins it and deletes the stream.
    void reader_finished(local_stream * ended);
    void reap_finished(std::unique_lock<std::mutex> & lock);
    // Asks the next stage (GetInfo) for its local relay port and the encodings it takes;
    // moves new batches to the local relay once the gRPC stream has none in flight.
    void probe_local(std::unique_lock<std::mutex> & lock);
    // A local relay connection broke or was refused (the caller holds the lock).
    void forget_local_relay();
    // A stream to the next stage broke (`local`: the local relay's): what the link learnt of
    // the next stage is asked again (the caller holds the lock).
    void forget_next_stage(bool local);
    // Detaches and releases a broken stream (or one whose oldest batch is past the
    // deadline): no stream callback takes the link's lock while it could be held.
    void watch_streams();

    // Adds the route key's proof to a call to the next stage.
    void authenticate(grpc::ClientContext & context) const;

    std::unique_ptr<pb::ShardService::Stub> stub_;
    const std::chrono::milliseconds         deadline_;
    const route_key                         key_;
    const bool                              try_local_;
    const boundary_encoding                 compress_;
    std::atomic<bool>                       taken_{false}; // the next stage takes compress_

    std::mutex              mutex_;
    std::condition_variable changed_;
    stream *                current_      = nullptr; // the stream new batches go to
    std::vector<local_stream *> finished_;          // readers ended, to join and delete
    int                     live_streams_ = 0;
    uint64_t                next_batch_   = 1;
    int                     local_port_   = 0;    // the next stage's local relay (0: gRPC)
    std::string             local_token_;         // what a connection to it opens with
    bool                    probe_due_    = true; // ask again (at start, after a break)
    std::chrono::steady_clock::time_point last_probe_{};
    bool                    stopping_     = false;
    std::thread             watchdog_;
};

} // namespace meshnet
