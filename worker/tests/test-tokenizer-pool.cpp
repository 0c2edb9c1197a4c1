// test-tokenizer-pool.cpp - Tokenize's pool runs a few jobs at once, lets a few wait, and
// refuses the rest at once instead of queueing them without bound.
#include "service_test.h"
#include "tokenizer_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

using namespace meshnet;

TEST("two run, two wait, a fifth is refused; all taken run once the first finish") {
    std::mutex              mutex;
    std::condition_variable changed;
    bool                    open = false;
    std::atomic<int>        started{0}, finished{0};
    auto blocking = [&] {
        ++started;
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return open; });
        ++finished;
    };
    {
        tokenizer_pool pool(2, 2);
        for (int i = 0; i < 4; ++i) {
            CHECK(pool.try_run(blocking));
        }
        while (started.load() < 2) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        CHECK(!pool.try_run(blocking)); // 2 running, 2 waiting
        CHECK(started.load() == 2);
        {
            std::lock_guard<std::mutex> lock(mutex);
            open = true;
        }
        changed.notify_all();
        while (finished.load() < 4) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        CHECK(pool.try_run([&] { ++finished; })); // room again
    } // joins: what was taken ran
    CHECK(finished.load() == 5);
}

TEST_MAIN()
