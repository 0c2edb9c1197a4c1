// rate_limited_log.h - one stderr line now and then for events a stranger can cause at
// will (refused connections, unparseable requests), not one per event.
#pragma once

#include <chrono>
#include <mutex>
#include <string>

namespace meshnet {

class rate_limited_log {
  public:
    // Lines start "meshnet-shard-worker: <topic>: "; at most one per `every`.
    explicit rate_limited_log(std::string topic, std::chrono::seconds every = std::chrono::seconds(10));

    // Logs `what`, with the count of events kept quiet since the last line.
    void say(const std::string & what);

  private:
    using clock = std::chrono::steady_clock;

    const std::string         topic_;
    const std::chrono::seconds every_;
    std::mutex                mutex_;
    clock::time_point         last_{};
    int                       quiet_ = 0;
};

} // namespace meshnet
