// heap_trim.h - hands the memory of a burst back to the system. glibc keeps what large
// requests freed in its arenas (a burst of 64 refused 60 MiB requests left 1.2 GB held
// for good). Blocks of 1 MiB and more are mapped and unmapped on their own, and every
// second the trimmer looks at how much malloc holds free and returns it with
// malloc_trim once enough was freed since it last looked low.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>

namespace meshnet {

// When trimming pays: `threshold` bytes or more freed since malloc last held the least
// free memory (or since the last trim). Fed the free bytes malloc holds, now and then.
class heap_trim_policy {
public:
    explicit heap_trim_policy(size_t threshold) : threshold_(threshold) {}

    // True: trim now (and count from here).
    bool due(size_t free_bytes);

private:
    size_t threshold_;
    size_t low_ = 0;
};

// One per process: it fixes malloc's mmap threshold (process-wide) at mmap_threshold.
class heap_trimmer {
public:
    static constexpr size_t mmap_threshold = 1u << 20;

    explicit heap_trimmer(size_t threshold = 16u << 20, std::chrono::milliseconds every = std::chrono::seconds(1));
    ~heap_trimmer();
    heap_trimmer(const heap_trimmer &) = delete;
    heap_trimmer & operator=(const heap_trimmer &) = delete;

private:
    void run();

    heap_trim_policy          policy_;
    std::chrono::milliseconds every_;
    std::mutex                mutex_;
    std::condition_variable   wake_;
    bool                      stopping_ = false;
    std::thread               thread_;
};

} // namespace meshnet
