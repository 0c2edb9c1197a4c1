// prefix_cache.cpp - see prefix_cache.h.
#include "prefix_cache.h"

#include <algorithm>

namespace meshnet {

prefix_cache::prefix_cache(int32_t n_slots, int32_t block, bool whole_only)
    : block_(std::max(block, 0)), whole_only_(whole_only), slots_(static_cast<size_t>(std::max(n_slots, 0))) {}

void prefix_cache::stepped(int32_t slot, const std::string & route_id, uint64_t epoch, int64_t n_past,
                           const std::vector<int32_t> & tokens, const std::string & salt) {
    if (block_ <= 0 || slot < 0 || static_cast<size_t>(slot) >= slots_.size()) {
        return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    slot_prefix & prefix = slots_[static_cast<size_t>(slot)];
    if (n_past == 0) {
        prefix = slot_prefix{route_id, epoch, salt, {}};
    }
    // Only a whole block fed as one step where the exact prefix ends computes as a cold
    // run's prefill does; anything else (a wider or narrower step, decode) ends it there.
    if (static_cast<int64_t>(prefix.tokens.size()) == n_past && n_past % block_ == 0 &&
        static_cast<int64_t>(tokens.size()) == block_ && prefix.route_id == route_id && prefix.epoch == epoch &&
        prefix.salt == salt) {
        prefix.tokens.insert(prefix.tokens.end(), tokens.begin(), tokens.end());
    }
}

void prefix_cache::truncated(int32_t slot, int64_t from) {
    if (block_ <= 0 || slot < 0 || static_cast<size_t>(slot) >= slots_.size() || from < 0) {
        return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    auto & tokens = slots_[static_cast<size_t>(slot)].tokens;
    const int64_t keep = std::min<int64_t>(static_cast<int64_t>(tokens.size()), from / block_ * block_);
    tokens.resize(static_cast<size_t>(keep));
}

void prefix_cache::forget(int32_t slot) {
    if (slot < 0 || static_cast<size_t>(slot) >= slots_.size()) {
        return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    slots_[static_cast<size_t>(slot)] = slot_prefix{};
}

void prefix_cache::copied(int32_t source, int32_t slot, int64_t n) {
    if (source < 0 || slot < 0 || static_cast<size_t>(std::max(source, slot)) >= slots_.size()) {
        return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    slot_prefix copy = slots_[static_cast<size_t>(source)];
    copy.tokens.resize(std::min(copy.tokens.size(), static_cast<size_t>(std::max<int64_t>(n, 0))));
    slots_[static_cast<size_t>(slot)] = std::move(copy);
}

int64_t prefix_cache::held(int32_t slot) const {
    if (slot < 0 || static_cast<size_t>(slot) >= slots_.size()) {
        return 0;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int64_t>(slots_[static_cast<size_t>(slot)].tokens.size());
}

std::vector<int32_t> prefix_cache::tokens(int32_t slot) const {
    if (slot < 0 || static_cast<size_t>(slot) >= slots_.size()) {
        return {};
    }
    std::lock_guard<std::mutex> lock(mutex_);
    return slots_[static_cast<size_t>(slot)].tokens;
}

prefix_cache::match prefix_cache::find(const std::string & route_id, uint64_t epoch,
                                       const std::vector<int32_t> & tokens,
                                       const std::vector<int32_t> & candidates, const std::string & salt) const {
    match best;
    if (block_ <= 0) {
        return best;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    for (int32_t slot : candidates) {
        if (slot < 0 || static_cast<size_t>(slot) >= slots_.size()) {
            continue;
        }
        const slot_prefix & prefix = slots_[static_cast<size_t>(slot)];
        if (prefix.route_id != route_id || prefix.epoch != epoch || prefix.salt != salt) {
            continue; // another route's, an older epoch's or another tenant's KV is never reused
        }
        const size_t n = std::min(prefix.tokens.size(), tokens.size());
        const auto differs = std::mismatch(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n),
                                           prefix.tokens.begin()).first;
        int64_t same = static_cast<int64_t>(differs - tokens.begin()) / block_ * block_;
        if (whole_only_ && same != static_cast<int64_t>(prefix.tokens.size())) {
            same = 0; // a part of it is not reusable
        }
        if (same > best.held) {
            best = match{slot, same};
        }
    }
    return best;
}

} // namespace meshnet
