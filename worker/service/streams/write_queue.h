// write_queue.h - the messages a gRPC stream reactor has yet to write: a reactor may have
// one write in flight, so the others wait here in order.
#pragma once

#include <cstddef>
#include <deque>
#include <utility>

namespace meshnet {

template <typename Message>
class write_queue {
public:
    void push(Message message) { waiting_.push_back(std::move(message)); }

    // The next message to hand to StartWrite, or nullptr while one is in flight or none
    // waits; it stays valid until done().
    Message * next() {
        if (writing_ || waiting_.empty()) {
            return nullptr;
        }
        current_ = std::move(waiting_.front());
        waiting_.pop_front();
        writing_ = true;
        return &current_;
    }

    void done() { writing_ = false; }    // OnWriteDone
    void clear() { waiting_.clear(); }   // the stream can take no more
    bool idle() const { return !writing_ && waiting_.empty(); }
    size_t waiting() const { return waiting_.size(); } // not counting the one in flight

private:
    std::deque<Message> waiting_;
    Message             current_;
    bool                writing_ = false;
};

} // namespace meshnet
