// prefix_slots.cpp - entries, hits, snapshots and settling of the prefix cache's slots
// (prefix_slots.h).
#include "prefix_slots.h"

#include <algorithm>

namespace meshnet {

void prefix_slots::configure(int32_t block, int32_t max_entries) {
    if (block <= 0 || max_entries <= 0 || !engine_.info().can_copy_prefix) {
        cache_.reset();
        return;
    }
    const engine_info & info = engine_.info();
    cache_ = std::make_unique<prefix_cache>(sessions_.n_slots(), block, info.copies_whole_only,
                                            prefix_cache::roles{!info.is_first(), !info.is_last()});
    max_entries_ = static_cast<size_t>(max_entries);
}

prefix_counts prefix_slots::stats() const {
    prefix_counts counts;
    counts.lookups           = lookups_.load();
    counts.hits              = hits_.load();
    counts.reused_tokens     = reused_.load();
    counts.entries           = sessions_.entries();
    counts.snapshots_skipped = snapshots_skipped_.load();
    if (cache_) {
        for (int32_t slot : sessions_.entry_slots()) {
            counts.entry_tokens += cache_->held(slot);
        }
    }
    return counts;
}

void prefix_slots::clear(int32_t slot) {
    engine_.slot_clear(slot);
    if (cache_) {
        cache_->forget(slot);
    }
}

bool prefix_slots::release(const session_key & key) {
    const int32_t slot = sessions_.release(key);
    if (slot < 0) {
        return false;
    }
    if (cache_ && !cache_->whole_only() && cache_->held(slot) > 0) {
        // Its exact prefix stays for later sessions; the positions after it are dropped
        // when one copies it.
        sessions_.keep(slot, session_clock::now());
        for (int32_t dropped : sessions_.drop_entries(max_entries_)) {
            clear(dropped);
        }
    } else {
        clear(slot);
    }
    return true;
}

int32_t prefix_slots::source(const prefix_ask & ask, std::optional<shard_error> & error) {
    ++lookups_;
    prefix_cache::match found;
    if (cache_ && static_cast<int64_t>(ask.tokens.size()) == ask.n_past) {
        std::vector<int32_t> candidates;
        if (cache_->whole_only()) {
            candidates = sessions_.entry_slots(); // a live session holds more than its prefix
        } else {
            for (int32_t slot = 0; slot < sessions_.n_slots(); ++slot) {
                candidates.push_back(slot); // entries and live sessions alike: positions before
            }                               // a slot's exact prefix end are never rewritten
        }
        found = cache_->find(ask.key.route_id, ask.key.epoch, ask.tokens, ask.chain, candidates, ask.salt);
    }
    if (found.slot >= 0 && found.held >= ask.n_past && ask.n_past > 0) {
        return found.slot;
    }
    error = make_error(error_reason::cache_miss,
        "the stage holds no exact prefix of " + std::to_string(ask.n_past) + " of these tokens",
        {{"stage_n_past", "0"}, {"expected_n_past", std::to_string(ask.n_past)},
         {"prefix_held", std::to_string(std::min<int64_t>(found.held, ask.n_past))}});
    return -1;
}

bool prefix_slots::copy(int32_t source, int32_t slot, const session_key & key, int64_t n_past,
                        std::vector<int32_t> & busy, session_clock::time_point now, std::vector<std::string> & chain) {
    // The slot holds the source's first n_past positions (the source's own slot when that
    // was the entry it took: it keeps them and drops the rest).
    if (!engine_.slot_copy_prefix(source, slot, static_cast<int32_t>(n_past))) {
        return false;
    }
    cache_->copied(source, slot, n_past);
    chain = cache_->output_chain(slot, n_past);
    sessions_.touch_entry(source, now);
    if (cache_->whole_only()) {
        busy.push_back(source); // its copy lands at the decode: keep it until then
        copied_.emplace_back(slot, key);
    }
    ++hits_;
    reused_ += n_past;
    return true;
}

void prefix_slots::snapshot(int32_t slot, const session_key & key, int64_t n_past, const std::string & salt,
                            std::vector<int32_t> & busy, session_clock::time_point now) {
    if (!whole_only()) {
        return;
    }
    if (n_past <= 0 || cache_->held(slot) != n_past) {
        ++snapshots_skipped_; // not all of it fed on the grid: no cold run's state
        return;
    }
    const prefix_cache::match same = cache_->find(key.route_id, key.epoch, cache_->tokens(slot),
                                                  cache_->input_chain(slot), sessions_.entry_slots(), salt);
    if (same.held == n_past) {
        sessions_.touch_entry(same.slot, now); // held already
        return;
    }
    const int32_t spare = sessions_.take_for_entry(max_entries_, busy);
    if (spare < 0) {
        ++snapshots_skipped_; // never at a live session's cost
        return;
    }
    clear(spare);
    if (!engine_.slot_copy_prefix(slot, spare, static_cast<int32_t>(n_past))) {
        ++snapshots_skipped_;
        return;
    }
    cache_->copied(slot, spare, n_past);
    sessions_.keep(spare, now);
    // the copy lands at this batch's decode: until then no session may take or clear it
    busy.push_back(spare);
    copied_.emplace_back(spare, session_key{});
}

void prefix_slots::truncated(int32_t slot, int64_t from) {
    if (cache_) {
        cache_->truncated(slot, from);
    }
}

void prefix_slots::stepped(int32_t slot, const session_key & key, int64_t n_past, const std::vector<int32_t> & tokens,
                           const std::string & salt, const std::string & input) {
    if (cache_) {
        cache_->stepped(slot, key.route_id, key.epoch, n_past, tokens, salt, input);
    }
}

void prefix_slots::sent(int32_t slot, int64_t n_past, const std::string & digest) {
    if (cache_) {
        cache_->sent(slot, n_past, digest);
    }
}

void prefix_slots::settle(bool decoded) {
    if (decoded) {
        for (int32_t slot : unsettled_) {
            clear(slot); // what landed there is no one's
        }
        unsettled_.clear();
    } else {
        for (const auto & [slot, key] : copied_) {
            if (sessions_.release(key) != slot) { // (an entry's: no session holds it)
                sessions_.drop_entry(slot);
            }
            cache_->forget(slot);
            unsettled_.push_back(slot);
        }
    }
    copied_.clear();
}

} // namespace meshnet
