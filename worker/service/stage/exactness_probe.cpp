// exactness_probe.cpp - see exactness_probe.h.
//
// Step invariance: a fixed sequence runs as one-row steps in one slot (the reference), then
// in another slot as steps of 1, 2, ..., W rows one after the other (positions 0..W(W+1)/2-1:
// the widest step attends over 28 cached positions), each row compared bit for bit with the
// reference. The first width that differs ends it, so every width up to the result held.
// Batch invariance: up to `step_rows` sessions (slots) step the same sequence one row at a
// time, each starting a step after the previous one, so every engine step mixes rows of
// different cache lengths; each row compared with the reference.
#include "exactness_probe.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

namespace meshnet {
namespace {

// Positions each session of the batch probe steps through.
constexpr int32_t batch_positions = 12;

uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

class probe {
public:
    explicit probe(engine_i & engine)
        : engine_(engine), info_(engine.info()),
          width_(static_cast<size_t>(info_.is_last() ? info_.n_vocab : info_.boundary_row)) {}

    // The reference: positions [0, n) as one-row steps in `slot`.
    bool run_reference(int32_t slot, int32_t n) {
        for (int32_t pos = 0; pos < n; ++pos) {
            std::vector<float> out;
            if (!run_one(request(slot, pos, 1), out)) {
                return false;
            }
            reference_.push_back(std::move(out));
        }
        return true;
    }

    // Steps of 1..widest rows in `slot` from position 0: the widest width up to which every
    // row held the reference's bits.
    bool widest_exact(int32_t slot, int32_t widest, int32_t & exact) {
        exact = 0;
        int32_t pos = 0;
        for (int32_t n = 1; n <= widest; ++n) {
            std::vector<float> out;
            if (!run_one(request(slot, pos, n), out)) {
                return false;
            }
            for (int32_t row = 0; row < n; ++row) {
                if (!same(out, row, pos + row)) {
                    differs_ = "a step of " + std::to_string(n) + " rows differs from one-row steps at position " +
                               std::to_string(pos + row);
                    return true;
                }
            }
            exact = n;
            pos += n;
        }
        return true;
    }

    // `sessions` slots (0..sessions-1) step positions [0, n) one row at a time, each a step
    // behind the previous one, sharing engine steps: whether every row held the reference's bits.
    bool shared_steps_exact(int32_t sessions, int32_t n, bool & exact) {
        exact = true;
        for (int32_t t = 0; t < n + sessions - 1; ++t) {
            std::vector<step_request> requests;
            for (int32_t s = 0; s < sessions; ++s) {
                const int32_t pos = t - s;
                if (pos >= 0 && pos < n) {
                    requests.push_back(request(s, pos, 1));
                }
            }
            const std::vector<step_result> results = engine_.step(requests);
            for (size_t r = 0; r < results.size(); ++r) {
                if (results[r].status != engine_status::ok) {
                    error_ = results[r].message;
                    return false;
                }
                const int32_t pos = requests[r].positions.front();
                if (exact && !same(output(results[r]), 0, pos)) {
                    exact = false;
                    differs_ = "a step of " + std::to_string(requests.size()) + " sessions' rows differs from "
                               "their steps alone at position " + std::to_string(pos);
                }
            }
        }
        return true;
    }

    const std::string & error() const { return error_; }
    const std::string & differs() const { return differs_; }

private:
    // The probe's inputs, the same at every start: a token id and a boundary row per position.
    int32_t token(int32_t pos) const {
        return static_cast<int32_t>(mix(static_cast<uint32_t>(pos) + 1) % static_cast<uint32_t>(info_.n_vocab));
    }
    float value(int32_t pos, int64_t i) const { // in [-1, 1)
        const uint32_t bits = mix(static_cast<uint32_t>(pos) * 0x9e3779b9U ^ static_cast<uint32_t>(i));
        return static_cast<float>(bits & 0xffffU) / 32768.0f - 1.0f;
    }

    step_request request(int32_t slot, int32_t pos0, int32_t n) const {
        step_request r;
        r.slot = slot;
        for (int32_t i = 0; i < n; ++i) {
            const int32_t pos = pos0 + i;
            r.positions.push_back(pos);
            if (info_.is_first() || info_.needs_token_sideband) {
                r.tokens.push_back(token(pos));
            }
            if (!info_.is_first()) {
                for (int64_t j = 0; j < info_.boundary_row; ++j) {
                    r.boundary.push_back(value(pos, j));
                }
            }
            if (info_.is_last()) {
                r.output_rows.push_back(i);
            }
        }
        return r;
    }

    const std::vector<float> & output(const step_result & result) const {
        return info_.is_last() ? result.logits : result.boundary;
    }

    bool run_one(const step_request & r, std::vector<float> & out) {
        step_result result = engine_.step({r}).at(0);
        if (result.status != engine_status::ok) {
            error_ = result.message;
            return false;
        }
        out = std::move(info_.is_last() ? result.logits : result.boundary);
        return true;
    }

    bool same(const std::vector<float> & out, int32_t row, int32_t pos) const {
        const size_t at = static_cast<size_t>(row) * width_;
        return out.size() >= at + width_ &&
               std::memcmp(out.data() + at, reference_[static_cast<size_t>(pos)].data(), width_ * sizeof(float)) == 0;
    }

    engine_i &                      engine_;
    const engine_info &             info_;
    size_t                          width_;    // floats per output row
    std::vector<std::vector<float>> reference_; // one-row steps' output, by position
    std::string                     error_;
    std::string                     differs_;
};

void clear_all(engine_i & engine) {
    for (int32_t slot = 0; slot < engine.info().n_slots; ++slot) {
        engine.slot_clear(slot);
    }
}

exactness measure(engine_i & engine, int32_t max_rows, int32_t max_step_tokens) {
    const engine_info & info = engine.info();
    exactness result;
    int32_t widest = std::min({max_rows, max_exact_step_rows, max_step_tokens});
    while (widest > 0 && widest * (widest + 1) / 2 > info.n_ctx) {
        --widest;
    }
    if (widest <= 0 || info.n_slots <= 0) {
        result.detail = max_rows <= 0 ? "not measured: --exact-batch-rows 0 claims no exact step"
                                      : "not measured: no room for a step";
        return result;
    }
    const int32_t positions = widest * (widest + 1) / 2;
    probe p(engine);
    const int32_t windows_slot = info.n_slots > 1 ? 1 : 0;
    if (!p.run_reference(0, positions)) {
        result.detail = "not measured: a probe step failed: " + p.error();
        return result;
    }
    if (windows_slot == 0) {
        engine.slot_clear(0);
    }
    if (!p.widest_exact(windows_slot, widest, result.step_rows)) {
        result.step_rows = 0;
        result.detail = "not measured: a probe step failed: " + p.error();
        return result;
    }
    result.detail = result.step_rows == 0 ? p.differs()
        : "steps of 1.." + std::to_string(result.step_rows) + " rows give one-row steps' bits over positions 0.." +
          std::to_string(positions - 1) + (result.step_rows < widest ? " (" + p.differs() + ")" : "");
    const int32_t sessions = std::min(info.n_slots, result.step_rows);
    if (sessions < 2) {
        result.detail += "; batching not measured: " +
                         std::string(info.n_slots < 2 ? "one slot" : "no step of two rows is exact");
        return result;
    }
    clear_all(engine);
    bool exact = false;
    if (!p.shared_steps_exact(sessions, std::min(batch_positions, positions), exact)) {
        result.detail += "; batching not measured: a probe step failed: " + p.error();
        return result;
    }
    result.batching = exact;
    result.detail += exact ? "; " + std::to_string(sessions) + " sessions' rows in one step compute as alone"
                           : "; " + p.differs();
    return result;
}

} // namespace

exactness measure_exactness(engine_i & engine, int32_t max_rows, int32_t max_step_tokens) {
    const auto started = std::chrono::steady_clock::now();
    exactness result = measure(engine, max_rows, max_step_tokens);
    clear_all(engine); // the probe's positions are nobody's
    result.probe_micros =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - started).count();
    return result;
}

} // namespace meshnet
