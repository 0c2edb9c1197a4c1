// session_store.cpp - slot bookkeeping; the engine's KV for a slot is cleared by the
// caller whenever a slot changes owner.
#include "session_store.h"

#include <algorithm>

namespace meshnet {

session_store::session_store(int32_t n_slots, session_clock::duration evict_idle)
    : evict_idle_(evict_idle), slot_owner_(static_cast<size_t>(std::max(n_slots, 0)), nullptr) {}

int32_t session_store::find(const session_key & key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = sessions_.find(key);
    return it == sessions_.end() ? -1 : it->second.slot;
}

session_store::acquire_result session_store::acquire(const session_key & key, const std::vector<int32_t> & busy,
                                                     session_clock::time_point now, int32_t spare) {
    std::lock_guard<std::mutex> lock(mutex_);
    return acquire_locked(key, busy, now, spare);
}

session_store::admission session_store::admit(const session_key & key, int64_t n_past,
                                              const std::vector<int32_t> & busy, session_clock::time_point now,
                                              int32_t prefix_source) {
    std::lock_guard<std::mutex> lock(mutex_);
    admission result;
    const auto found = sessions_.find(key);
    if (found != sessions_.end()) {
        result.slot = found->second.slot;
        return result;
    }
    if (n_past > 0 && prefix_source < 0) { // its positions are not here to build on
        result.refused = admission::refusal::cache_miss;
        return result;
    }
    const acquire_result acquired = acquire_locked(key, busy, now, prefix_source);
    if (acquired.slot < 0) {
        result.refused = admission::refusal::capacity_exhausted;
        return result;
    }
    result.slot       = acquired.slot;
    result.fresh      = true;
    result.took_entry = acquired.took_entry;
    return result;
}

session_store::acquire_result session_store::acquire_locked(const session_key & key,
                                                            const std::vector<int32_t> & busy,
                                                            session_clock::time_point now, int32_t spare) {
    acquire_result result;
    const auto found = sessions_.find(key);
    if (found != sessions_.end()) {
        result.slot = found->second.slot;
        return result;
    }
    int32_t slot = free_slot_locked(busy);
    if (slot < 0) {
        slot = oldest_entry_locked(spare, busy);
        if (slot >= 0) {
            kept_.erase(slot);
            result.took_entry = true;
        }
    }
    if (slot < 0) {
        auto victim = sessions_.end();
        for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
            const bool in_step = std::find(busy.begin(), busy.end(), it->second.slot) != busy.end();
            if (in_step || now - it->second.last_used < evict_idle_) {
                continue;
            }
            if (victim == sessions_.end() || it->second.last_used < victim->second.last_used) {
                victim = it;
            }
        }
        if (victim == sessions_.end()) {
            return result;
        }
        slot                = victim->second.slot;
        result.evicted      = true;
        result.evicted_key  = victim->first;
        sessions_.erase(victim);
    }
    const auto inserted = sessions_.emplace(key, entry{slot, now}).first;
    slot_owner_[static_cast<size_t>(slot)] = &inserted->first;
    result.slot    = slot;
    result.created = true;
    return result;
}

void session_store::touch(const session_key & key, session_clock::time_point now) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = sessions_.find(key);
    if (it != sessions_.end()) {
        it->second.last_used = now;
    }
}

int32_t session_store::release(const session_key & key) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = sessions_.find(key);
    if (it == sessions_.end()) {
        return -1;
    }
    const int32_t slot = it->second.slot;
    slot_owner_[static_cast<size_t>(slot)] = nullptr;
    sessions_.erase(it);
    return slot;
}

int32_t session_store::free_slot_locked(const std::vector<int32_t> & busy) const {
    for (size_t i = 0; i < slot_owner_.size(); ++i) {
        const auto slot = static_cast<int32_t>(i);
        if (slot_owner_[i] == nullptr && kept_.count(slot) == 0 &&
            std::find(busy.begin(), busy.end(), slot) == busy.end()) {
            return slot;
        }
    }
    return -1;
}

int32_t session_store::oldest_entry_locked(int32_t spare, const std::vector<int32_t> & busy) const {
    int32_t oldest = -1;
    for (const auto & [slot, last_used] : kept_) {
        if (slot != spare && std::find(busy.begin(), busy.end(), slot) == busy.end() &&
            (oldest < 0 || last_used < kept_.at(oldest))) {
            oldest = slot;
        }
    }
    return oldest >= 0 || kept_.count(spare) == 0 ? oldest : spare;
}

int32_t session_store::take_for_entry(size_t most, const std::vector<int32_t> & busy) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (most == 0) {
        return -1;
    }
    if (kept_.size() < most) {
        if (const int32_t slot = free_slot_locked(busy); slot >= 0) {
            return slot;
        }
    }
    const int32_t slot = oldest_entry_locked(-1, busy);
    if (slot >= 0) {
        kept_.erase(slot);
    }
    return slot;
}

void session_store::drop_entry(int32_t slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    kept_.erase(slot);
}

void session_store::keep(int32_t slot, session_clock::time_point now) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (slot >= 0 && slot < n_slots() && slot_owner_[static_cast<size_t>(slot)] == nullptr) {
        kept_[slot] = now;
    }
}

void session_store::touch_entry(int32_t slot, session_clock::time_point now) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = kept_.find(slot);
    if (it != kept_.end()) {
        it->second = now;
    }
}

std::vector<int32_t> session_store::drop_entries(size_t most) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<int32_t> dropped;
    while (kept_.size() > most) {
        const int32_t slot = oldest_entry_locked(-1);
        kept_.erase(slot);
        dropped.push_back(slot);
    }
    return dropped;
}

int32_t session_store::entries() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int32_t>(kept_.size());
}

std::vector<int32_t> session_store::entry_slots() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<int32_t> slots;
    for (const auto & entry : kept_) {
        slots.push_back(entry.first);
    }
    return slots;
}

int32_t session_store::slots_free() const {
    std::lock_guard<std::mutex> lock(mutex_);
    // a kept entry gives its slot to any session that needs it: free for capacity
    return static_cast<int32_t>(std::count(slot_owner_.begin(), slot_owner_.end(), nullptr));
}

int32_t session_store::recently_used(session_clock::time_point now, session_clock::duration window) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int32_t>(std::count_if(sessions_.begin(), sessions_.end(),
        [&](const auto & entry) { return now - entry.second.last_used <= window; }));
}

int32_t session_store::active() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int32_t>(sessions_.size());
}

} // namespace meshnet
