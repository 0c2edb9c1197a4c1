// tokenizer_pool.h - Tokenize's own few threads: text is tokenized off gRPC's threads and
// the engine thread, so one request's long tokenizing never holds up health, GetInfo,
// handshakes or other sessions' steps; what finds every thread busy and the queue full
// is refused at once rather than queued without bound.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace meshnet {

class tokenizer_pool {
public:
    tokenizer_pool(size_t threads, size_t max_waiting);
    ~tokenizer_pool(); // runs what it took, then joins
    tokenizer_pool(const tokenizer_pool &) = delete;
    tokenizer_pool & operator=(const tokenizer_pool &) = delete;

    // Runs `job` on a pool thread; false (and `job` dropped) when `threads` jobs run and
    // `max_waiting` wait already.
    bool try_run(std::function<void()> job);

private:
    void work();

    const size_t                      threads_;
    const size_t                      max_waiting_;
    std::mutex                        mutex_;
    std::condition_variable           wake_;
    std::deque<std::function<void()>> waiting_;
    size_t                            running_  = 0;
    bool                              stopping_ = false;
    std::vector<std::thread>          workers_;
};

} // namespace meshnet
