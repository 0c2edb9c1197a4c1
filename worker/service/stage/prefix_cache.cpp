// prefix_cache.cpp - see prefix_cache.h.
#include "prefix_cache.h"
#include "prefix_digest.h"

#include <algorithm>

namespace meshnet {

bool grid_block(int32_t block, int64_t n_past, int64_t n_tokens) {
    return block > 0 && n_past % block == 0 && n_tokens == block;
}

prefix_cache::prefix_cache(int32_t n_slots, int32_t block, bool whole_only, roles stage)
    : block_(std::max(block, 0)), whole_only_(whole_only), roles_(stage),
      slots_(static_cast<size_t>(std::max(n_slots, 0))) {}

int64_t prefix_cache::usable(const slot_prefix & prefix) const {
    const int64_t n = static_cast<int64_t>(prefix.tokens.size());
    return roles_.relays_output ? std::min<int64_t>(n, static_cast<int64_t>(prefix.output.size()) * block_) : n;
}

prefix_cache::slot_prefix prefix_cache::prefix_of(const slot_prefix & prefix, int64_t n) const {
    slot_prefix cut = prefix;
    const size_t keep = static_cast<size_t>(std::clamp<int64_t>(n, 0, static_cast<int64_t>(cut.tokens.size())) /
                                            block_ * block_);
    const size_t blocks = keep / static_cast<size_t>(block_);
    cut.tokens.resize(keep);
    cut.input.resize(std::min(cut.input.size(), blocks));
    cut.output.resize(std::min(cut.output.size(), blocks));
    return cut;
}

void prefix_cache::stepped(int32_t slot, const std::string & route_id, uint64_t epoch, int64_t n_past,
                           const std::vector<int32_t> & tokens, const std::string & salt,
                           const std::string & input) {
    if (block_ <= 0 || slot < 0 || static_cast<size_t>(slot) >= slots_.size()) {
        return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    slot_prefix & prefix = slots_[static_cast<size_t>(slot)];
    if (n_past == 0) {
        prefix = slot_prefix{route_id, epoch, salt, {}, {}, {}};
    }
    // Only a whole block fed as one step where the exact prefix ends computes as a cold
    // run's prefill does; anything else (a wider or narrower step, decode) ends it there.
    // A block computed from a boundary extends it only with that boundary's digest.
    if (static_cast<int64_t>(prefix.tokens.size()) == n_past && grid_block(block_, n_past, static_cast<int64_t>(tokens.size())) &&
        prefix.route_id == route_id && prefix.epoch == epoch && prefix.salt == salt &&
        (!roles_.checks_input || !input.empty())) {
        prefix.tokens.insert(prefix.tokens.end(), tokens.begin(), tokens.end());
        if (roles_.checks_input) {
            prefix.input.push_back(chain_digest(prefix.input.empty() ? "" : prefix.input.back(), input));
        }
    }
}

void prefix_cache::sent(int32_t slot, int64_t n_past, const std::string & output) {
    if (!roles_.relays_output || block_ <= 0 || slot < 0 || static_cast<size_t>(slot) >= slots_.size()) {
        return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    slot_prefix & prefix = slots_[static_cast<size_t>(slot)];
    // the block just added to the exact prefix, with every block before it sent on too
    const auto blocks = static_cast<int64_t>(prefix.output.size());
    if (n_past == blocks * block_ && static_cast<int64_t>(prefix.tokens.size()) == n_past + block_) {
        prefix.output.push_back(chain_digest(prefix.output.empty() ? "" : prefix.output.back(), output));
    }
}

void prefix_cache::truncated(int32_t slot, int64_t from) {
    if (block_ <= 0 || slot < 0 || static_cast<size_t>(slot) >= slots_.size() || from < 0) {
        return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    slot_prefix & prefix = slots_[static_cast<size_t>(slot)];
    prefix = prefix_of(prefix, from);
}

void prefix_cache::forget(int32_t slot) {
    if (slot < 0 || static_cast<size_t>(slot) >= slots_.size()) {
        return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    slots_[static_cast<size_t>(slot)] = slot_prefix{};
}

void prefix_cache::copied(int32_t source, int32_t slot, int64_t n) {
    if (block_ <= 0 || source < 0 || slot < 0 || static_cast<size_t>(std::max(source, slot)) >= slots_.size()) {
        return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    slots_[static_cast<size_t>(slot)] = prefix_of(slots_[static_cast<size_t>(source)], n);
}

int64_t prefix_cache::held(int32_t slot) const {
    if (slot < 0 || static_cast<size_t>(slot) >= slots_.size()) {
        return 0;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    return usable(slots_[static_cast<size_t>(slot)]);
}

std::vector<int32_t> prefix_cache::tokens(int32_t slot) const {
    if (slot < 0 || static_cast<size_t>(slot) >= slots_.size()) {
        return {};
    }
    std::lock_guard<std::mutex> lock(mutex_);
    const slot_prefix & prefix = slots_[static_cast<size_t>(slot)];
    return {prefix.tokens.begin(), prefix.tokens.begin() + static_cast<std::ptrdiff_t>(usable(prefix))};
}

std::vector<std::string> prefix_cache::input_chain(int32_t slot) const {
    if (block_ <= 0 || slot < 0 || static_cast<size_t>(slot) >= slots_.size()) {
        return {};
    }
    std::lock_guard<std::mutex> lock(mutex_);
    const slot_prefix & prefix = slots_[static_cast<size_t>(slot)];
    return prefix_of(prefix, usable(prefix)).input;
}

std::vector<std::string> prefix_cache::output_chain(int32_t slot, int64_t n) const {
    if (block_ <= 0 || slot < 0 || static_cast<size_t>(slot) >= slots_.size()) {
        return {};
    }
    std::lock_guard<std::mutex> lock(mutex_);
    return prefix_of(slots_[static_cast<size_t>(slot)], n).output;
}

prefix_cache::match prefix_cache::find(const std::string & route_id, uint64_t epoch,
                                       const std::vector<int32_t> & tokens, const std::vector<std::string> & chain,
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
        const size_t n = static_cast<size_t>(std::min<int64_t>(usable(prefix), static_cast<int64_t>(tokens.size())));
        const auto differs = std::mismatch(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n),
                                           prefix.tokens.begin()).first;
        int64_t same = static_cast<int64_t>(differs - tokens.begin()) / block_ * block_;
        if (roles_.checks_input) {
            // only blocks computed from the very boundary the request's chain names
            const size_t links = std::min(prefix.input.size(), chain.size());
            const auto unlike = std::mismatch(prefix.input.begin(),
                                              prefix.input.begin() + static_cast<std::ptrdiff_t>(links),
                                              chain.begin()).first;
            same = std::min<int64_t>(same, static_cast<int64_t>(unlike - prefix.input.begin()) * block_);
        }
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
