// ring.cpp - see ring.h.
#include "ring.h"

#include "rate_limited_log.h"
#include "route_key.h"

#include <cstdio>
#include <deque>

namespace meshnet {

namespace {

// Tokens a subscriber may fall behind by; past it new ones are dropped (the chain's
// answers still carry them, a loop only waits longer), so one that stops reading costs
// the stage a bounded queue, never a wait.
constexpr size_t max_queued_tokens = 4096;

bool same_route(const pb::RouteKey & a, const pb::RouteKey & b) {
    return a.route_id() == b.route_id() && a.epoch() == b.epoch();
}

} // namespace

// One subscriber's stream. gRPC runs its reactions (and OnDone) on its own threads, never
// inside StartWrite or Finish, so calling those under the hub's lock is safe.
class ring_subscriber final : public grpc::ServerWriteReactor<pb::RingResponse> {
public:
    ring_subscriber(ring_hub & hub, pb::RouteKey key, const std::string & incarnation)
        : hub_(hub), key_(std::move(key)) {
        pb::RingResponse hello;
        hello.set_incarnation(incarnation);
        std::lock_guard<std::recursive_mutex> lock(mutex_);
        queue_.push_back(std::move(hello));
        write_front();
    }

    bool serves(const pb::RouteKey & key) const { return same_route(key, key_); }

    void push(pb::RingResponse token) {
        std::lock_guard<std::recursive_mutex> lock(mutex_);
        if (finishing_ || queue_.size() >= max_queued_tokens) {
            return;
        }
        queue_.push_back(std::move(token));
        if (!writing_) {
            write_front();
        }
    }

    // Ends the stream once the write in flight (if any) is done.
    void end(const grpc::Status & status) {
        std::lock_guard<std::recursive_mutex> lock(mutex_);
        if (!finishing_) {
            finishing_ = true;
            status_    = status;
        }
        finish_if_idle();
    }

    void OnWriteDone(bool ok) override {
        std::lock_guard<std::recursive_mutex> lock(mutex_);
        writing_ = false;
        queue_.pop_front();
        if (!ok) {
            end(grpc::Status(grpc::StatusCode::CANCELLED, "the subscriber went away"));
            return;
        }
        if (!finishing_ && !queue_.empty()) {
            write_front();
        }
        finish_if_idle();
    }

    void OnCancel() override { end(grpc::Status(grpc::StatusCode::CANCELLED, "the subscriber cancelled")); }

    void OnDone() override {
        hub_.gone(this);
        delete this;
    }

private:
    void write_front() {
        writing_ = true;
        StartWrite(&queue_.front());
    }

    void finish_if_idle() {
        if (finishing_ && !writing_ && !finished_) {
            finished_ = true;
            Finish(status_);
        }
    }

    ring_hub &                hub_;
    const pb::RouteKey        key_;
    std::recursive_mutex      mutex_;
    std::deque<pb::RingResponse> queue_;
    bool                      writing_   = false;
    bool                      finishing_ = false;
    bool                      finished_  = false;
    grpc::Status              status_;
};

ring_hub::~ring_hub() {
    stop();
}

grpc::ServerWriteReactor<pb::RingResponse> * ring_hub::subscribe(const pb::RouteKey & key) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (subscribers_.size() >= max_subscribers_) {
        return nullptr;
    }
    auto * subscriber = new ring_subscriber(*this, key, incarnation_); // its reactions never run inside
    subscribers_.insert(subscriber);
    if (stopping_) {
        subscriber->end(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the last stage is stopping"));
    }
    return subscriber;
}

void ring_hub::publish(const pb::RouteKey & key, int64_t position, uint64_t window, const window_tokens & answer) {
    const std::vector<int32_t> & tokens = answer.tokens;
    if (tokens.empty()) {
        return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    for (ring_subscriber * subscriber : subscribers_) {
        if (subscriber->serves(key)) {
            pb::RingResponse message;
            *message.mutable_key() = key;
            message.set_position(position);
            message.set_window(window);
            message.set_token(tokens.front());
            message.mutable_tokens()->Add(tokens.begin(), tokens.end());
            message.mutable_next_drafts()->Add(answer.next_drafts.begin(), answer.next_drafts.end());
            subscriber->push(std::move(message));
        }
    }
}

void ring_hub::stop() {
    std::unique_lock<std::mutex> lock(mutex_);
    stopping_ = true;
    for (ring_subscriber * subscriber : subscribers_) {
        subscriber->end(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the last stage is stopping"));
    }
    changed_.wait_for(lock, std::chrono::seconds(2), [this] { return subscribers_.empty(); });
}

size_t ring_hub::subscribers() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return subscribers_.size();
}

void ring_hub::gone(ring_subscriber * subscriber) {
    std::lock_guard<std::mutex> lock(mutex_);
    subscribers_.erase(subscriber);
    changed_.notify_all();
}

ring_link::ring_link(std::shared_ptr<grpc::Channel> channel, pb::RouteKey key, std::string route_proof,
                     deliver_fn deliver)
    : stub_(pb::ShardService::NewStub(std::move(channel))), key_(std::move(key)),
      route_proof_(std::move(route_proof)), deliver_(std::move(deliver)) {
    thread_ = std::thread([this] { run(); });
}

ring_link::~ring_link() {
    stop();
    thread_.join();
}

void ring_link::stop() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
        if (call_ != nullptr) {
            call_->TryCancel();
        }
    }
    wake_.notify_all();
}

std::string ring_link::incarnation() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return incarnation_;
}

ring_link::wait_result ring_link::wait_subscribed(std::chrono::milliseconds bound, std::string & why) {
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait_for(lock, bound, [this] { return stopping_ || !incarnation_.empty(); });
    if (stopping_) {
        return wait_result::stopped;
    }
    if (!incarnation_.empty()) {
        return wait_result::subscribed;
    }
    why = last_failure_.empty() ? "no answer yet" : last_failure_;
    return wait_result::timed_out;
}

void ring_link::run() {
    rate_limited_log refused("ring", std::chrono::seconds(30));
    for (;;) {
        grpc::ClientContext context;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (stopping_) {
                return;
            }
            call_ = &context;
        }
        context.AddMetadata(route_auth_metadata, route_proof_);
        pb::RingRequest request;
        *request.mutable_key() = key_;
        auto reader = stub_->Ring(&context, request);
        pb::RingResponse message;
        bool hello = true;
        while (reader->Read(&message)) {
            if (hello) {
                hello = false;
                std::lock_guard<std::mutex> lock(mutex_);
                incarnation_ = message.incarnation();
                std::fprintf(stderr, "meshnet-shard-worker: ring: subscribed at the last stage (%s)\n",
                             incarnation_.c_str());
                wake_.notify_all(); // wait_subscribed
                continue;
            }
            deliver_(message);
        }
        const grpc::Status status = reader->Finish();
        std::unique_lock<std::mutex> lock(mutex_);
        call_ = nullptr;
        incarnation_.clear();
        if (stopping_) {
            return;
        }
        last_failure_ = std::to_string(status.error_code()) + ": " + status.error_message();
        refused.say("the last stage's stream ended (" + std::to_string(status.error_code()) + ": " +
                    status.error_message() + "); the loop goes on over the chain, subscribing again");
        wake_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stopping_; });
    }
}

void ring_waiters::expect(const session_key & key, uint64_t window, then_fn then) {
    std::lock_guard<std::mutex> lock(mutex_);
    waiting_[{key, window}] = std::move(then);
}

bool ring_waiters::forget(const session_key & key, uint64_t window) {
    std::lock_guard<std::mutex> lock(mutex_);
    return waiting_.erase({key, window}) > 0;
}

void ring_waiters::deliver(const session_key & key, uint64_t window, window_tokens tokens) {
    then_fn then;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        auto found = waiting_.find({key, window});
        if (found == waiting_.end()) {
            return; // the chain's answer came first, or the loop ended
        }
        then = std::move(found->second);
        waiting_.erase(found);
    }
    then(std::move(tokens));
}

} // namespace meshnet
