// heap_trim.cpp - see heap_trim.h.
#include "heap_trim.h"

#include <algorithm>
#include <malloc.h>

namespace meshnet {

bool heap_trim_policy::due(size_t free_bytes) {
    low_ = std::min(low_, free_bytes);
    if (free_bytes - low_ < threshold_) {
        return false;
    }
    low_ = free_bytes; // trimmed, these pages are back with the system until used again
    return true;
}

heap_trimmer::heap_trimmer(size_t threshold, std::chrono::milliseconds every)
    : policy_(threshold), every_(every) {
    // A fixed threshold: glibc's own rises to the largest block freed (up to 32 MiB),
    // after which a burst's large requests come from the arenas and stay there.
    mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmap_threshold));
    thread_ = std::thread([this] { run(); });
}

heap_trimmer::~heap_trimmer() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
}

void heap_trimmer::run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, every_, [this] { return stopping_; })) {
        if (policy_.due(mallinfo2().fordblks)) {
            malloc_trim(0);
        }
    }
}

} // namespace meshnet
