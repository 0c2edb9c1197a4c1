// tokenizer_pool.cpp - see tokenizer_pool.h.
#include "tokenizer_pool.h"

namespace meshnet {

tokenizer_pool::tokenizer_pool(size_t threads, size_t max_waiting) : threads_(threads), max_waiting_(max_waiting) {
    for (size_t i = 0; i < threads; ++i) {
        workers_.emplace_back([this] { work(); });
    }
}

tokenizer_pool::~tokenizer_pool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread & worker : workers_) {
        worker.join();
    }
}

bool tokenizer_pool::try_run(std::function<void()> job) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (running_ + waiting_.size() >= threads_ + max_waiting_) {
            return false;
        }
        waiting_.push_back(std::move(job));
    }
    wake_.notify_one();
    return true;
}

void tokenizer_pool::work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
        wake_.wait(lock, [this] { return stopping_ || !waiting_.empty(); });
        if (waiting_.empty()) {
            return; // stopping, and nothing left to run
        }
        std::function<void()> job = std::move(waiting_.front());
        waiting_.pop_front();
        ++running_;
        lock.unlock();
        job();
        lock.lock();
        --running_;
    }
}

} // namespace meshnet
