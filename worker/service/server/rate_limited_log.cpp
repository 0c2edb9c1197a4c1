#include "rate_limited_log.h"

#include <cstdio>
#include <utility>

namespace meshnet {

rate_limited_log::rate_limited_log(std::string topic, std::chrono::seconds every)
    : topic_(std::move(topic)), every_(every) {}

void rate_limited_log::say(const std::string & what) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = clock::now();
    if (last_ != clock::time_point{} && now - last_ < every_) {
        ++quiet_;
        return;
    }
    std::fprintf(stderr, "meshnet-shard-worker: %s: %s (%d more since the last line)\n", topic_.c_str(),
                 what.c_str(), quiet_);
    last_  = now;
    quiet_ = 0;
}

} // namespace meshnet
