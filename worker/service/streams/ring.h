// ring.h - the ring's back edge (the Ring RPC): the last stage sends each sampled token
// of a decode loop straight to the first stage, so a token costs S network legs instead
// of the chain's 2(S-1). ring_hub is the last stage's side (its subscribers), ring_link
// the first stage's subscription, ring_waiters the first stage's loops waiting for a
// token. The ring only speeds the loop up: the chain's answer still comes, and whichever
// arrives first continues the loop.
#pragma once

#include "session_store.h"

#include "meshnet/shard/v1/shard_service.grpc.pb.h"

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace meshnet {

namespace pb = ::meshnet::shard::v1;

class ring_subscriber;

// What a loop's step answered: its tokens (one, or the accepted drafts and one more) and the
// last stage's drafts for the next window (empty without a drafter there).
struct window_tokens {
    std::vector<int32_t> tokens;
    std::vector<int32_t> next_drafts;
};

// The last stage's subscribers: one stream per first stage that subscribed.
class ring_hub {
public:
    // At most `max_subscribers` streams at once: each costs the engine thread a copy of
    // every token, and only the route's first stages (one per replica here) need one.
    ring_hub(std::string incarnation, size_t max_subscribers)
        : incarnation_(std::move(incarnation)), max_subscribers_(max_subscribers) {}
    ~ring_hub();

    // The Ring RPC's stream for a subscriber whose key (and route key) was checked; null
    // when max_subscribers streams are open.
    grpc::ServerWriteReactor<pb::RingResponse> * subscribe(const pb::RouteKey & key);
    // Sends the token to every subscriber of the key's route and epoch; `window` is the
    // step's ForwardRequest.window.
    void publish(const pb::RouteKey & key, int64_t position, uint64_t window, const window_tokens & tokens);
    // Ends every stream (the worker stops) and waits until they are gone.
    void stop();

    size_t subscribers() const;

private:
    friend class ring_subscriber;
    void gone(ring_subscriber * subscriber);

    const std::string               incarnation_;
    const size_t                    max_subscribers_;
    mutable std::mutex              mutex_;
    std::condition_variable         changed_;
    std::set<ring_subscriber *>     subscribers_;
    bool                            stopping_ = false;
};

// The first stage's subscription at the last stage, kept up by a thread of its own:
// a broken or refused stream is subscribed again after a short pause.
class ring_link {
public:
    using deliver_fn = std::function<void(const pb::RingResponse &)>;

    // `key`: this stage's route_id and epoch; `route_proof`: the route key's proof, sent
    // with each subscription; `deliver` is called on the link's thread.
    ring_link(std::shared_ptr<grpc::Channel> channel, pb::RouteKey key, std::string route_proof, deliver_fn deliver);
    ~ring_link();

    ring_link(const ring_link &) = delete;
    ring_link & operator=(const ring_link &) = delete;

    // The last stage's incarnation while subscribed, else "".
    std::string incarnation() const;

    enum class wait_result { subscribed, timed_out, stopped };
    // Until subscribed, or at most `bound`, or until stop(); `why` gets the last
    // attempt's failure when it timed out.
    wait_result wait_subscribed(std::chrono::milliseconds bound, std::string & why);
    // Ends the subscription for good (the worker stops) and wakes wait_subscribed.
    void stop();

private:
    void run();

    std::unique_ptr<pb::ShardService::Stub> stub_;
    const pb::RouteKey                      key_;
    const std::string                       route_proof_;
    const deliver_fn                        deliver_;
    mutable std::mutex                      mutex_;
    std::condition_variable                 wake_;
    std::string                             incarnation_;
    std::string                             last_failure_; // how the last stream ended
    grpc::ClientContext *                   call_ = nullptr; // the stream being read
    bool                                    stopping_ = false;
    std::thread                             thread_;
};

// The first stage's decode loops waiting for the ring's token of (session, window): a
// loop's window numbers never repeat, while a step that replaces dropped windows can
// start at a position one of them had.
class ring_waiters {
public:
    using then_fn = std::function<void(window_tokens tokens)>;

    void expect(const session_key & key, uint64_t window, then_fn then);
    // True when it was still waiting (then is never called); false when the token came
    // first (then is running or ran).
    bool forget(const session_key & key, uint64_t window);
    // Calls the waiting loop's `then`, if any, outside the lock.
    void deliver(const session_key & key, uint64_t window, window_tokens tokens);

private:
    std::mutex                                             mutex_;
    std::map<std::pair<session_key, uint64_t>, then_fn>    waiting_;
};

} // namespace meshnet
