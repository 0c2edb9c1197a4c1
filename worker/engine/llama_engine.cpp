// llama_engine.cpp - engine_i on the patched llama.cpp: one layer range of a GGUF model in
// one context whose sequences are the session slots; a step is batched into one decode.
#include "cpu_backend.h"
#include "discard_bytes.h"
#include "drafter_factory.h"
#include "engine.h"
#include "gguf_facts.h"
#include "layer_range.h"
#include "rollback_depth.h"
#include "slot_memory.h"
#include "special_split.h"

#include "llama-cpp.h"
#include "llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string_view>
#include <thread>

namespace meshnet {

namespace {

// Keeps llama.cpp's error lines while a model loads, so a refused load can say why;
// everything is still passed on to the logger installed before.
class load_log_capture {
public:
    load_log_capture() {
        llama_log_get(&prev_callback_, &prev_user_data_);
        llama_log_set(&load_log_capture::on_log, this);
    }
    ~load_log_capture() { llama_log_set(prev_callback_, prev_user_data_); }

    load_log_capture(const load_log_capture &) = delete;
    load_log_capture & operator=(const load_log_capture &) = delete;

    // the last error line, without its "function: " prefix and newline
    std::string last_error() const {
        std::string line = last_error_;
        while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) {
            line.pop_back();
        }
        const size_t colon = line.find(": ");
        return colon == std::string::npos ? line : line.substr(colon + 2);
    }

private:
    static void on_log(ggml_log_level level, const char * text, void * user_data) {
        auto * self = static_cast<load_log_capture *>(user_data);
        if (level == GGML_LOG_LEVEL_ERROR && std::strstr(text, "error loading model:") != nullptr) {
            self->last_error_ = text;
        }
        if (self->prev_callback_) {
            self->prev_callback_(level, text, self->prev_user_data_);
        }
    }

    ggml_log_callback prev_callback_  = nullptr;
    void *            prev_user_data_ = nullptr;
    std::string       last_error_;
};

step_result failure(engine_status status, std::string message) {
    step_result result;
    result.status  = status;
    result.message = std::move(message);
    return result;
}

int32_t default_threads() {
    const unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 4 : static_cast<int32_t>(n);
}

class llama_engine final : public engine_i {
public:
    llama_engine(engine_info info, llama_model_ptr model, llama_context_ptr ctx, int32_t n_batch,
                 std::unique_ptr<tail_drafter> drafter)
        : info_(std::move(info)), model_(std::move(model)), ctx_(std::move(ctx)), n_batch_(n_batch),
          batch_(llama_batch_ext_init(ctx_.get())), depth_(info_.n_slots, info_.discard_depth),
          model_needs_ids_(llama_model_needs_token_ids(model_.get())), drafter_(std::move(drafter)) {}

    const engine_info & info() const override { return info_; }

    std::vector<step_result> step(const std::vector<step_request> & requests) override;

    int32_t slot_n_past(int32_t slot) const override {
        std::lock_guard<std::mutex> lock(mutex_);
        return n_past(slot);
    }

    void slot_clear(int32_t slot) override {
        std::lock_guard<std::mutex> lock(mutex_);
        if (slot >= 0 && slot < info_.n_slots) {
            clear(slot);
        }
    }

    discard_result slot_discard(int32_t slot, int32_t from) override;

    bool slot_copy_prefix(int32_t source, int32_t slot, int32_t n) override {
        std::lock_guard<std::mutex> lock(mutex_);
        if (slot < 0 || slot >= info_.n_slots) {
            return false;
        }
        if (!info_.can_copy_prefix || source < 0 || source >= info_.n_slots ||
            (info_.copies_whole_only && n != n_past(source))) {
            clear(slot);
            return false;
        }
        if (source != slot) {
            // Slots are KV streams of their own: the memory copies a whole stream (at the
            // next decode), then the copy's positions from `n` on are dropped, which puts
            // the stream's head back at cell `n`, where a cold run writes position `n` too.
            // (deepseek4 copies its compressed state too, at the next decode as well: until
            // then the source must not be cleared, which zeroes that state at once.)
            clear(slot);
            llama_memory_seq_cp(memory(), source, slot, -1, -1);
        }
        if (info_.copies_whole_only) {
            return true; // all of it: nothing to drop
        }
        if (!llama_memory_seq_rm(memory(), slot, n, -1)) {
            clear(slot);
            return false;
        }
        return true;
    }

    std::vector<int32_t> draft(int32_t slot, int32_t pos, int32_t token, int32_t most) override {
        std::lock_guard<std::mutex> lock(mutex_);
        return drafter_ ? drafter_->draft(slot, pos, token, most) : std::vector<int32_t>{};
    }

    int64_t kv_used() const override {
        std::lock_guard<std::mutex> lock(mutex_);
        int64_t used = 0;
        for (int32_t slot = 0; slot < info_.n_slots; ++slot) {
            used += n_past(slot);
        }
        return used;
    }

    int64_t kv_total() const override {
        return static_cast<int64_t>(info_.n_ctx) * info_.n_slots;
    }

    engine_status tokenize(const std::string & text, bool add_special, const std::vector<text_range> & literal,
                           std::vector<int32_t> & out) const override;
    engine_status detokenize(const std::vector<int32_t> & tokens, std::string & out) const override;

private:
    llama_memory_t memory() const { return llama_get_memory(ctx_.get()); }

    int32_t n_past(int32_t slot) const {
        if (slot < 0 || slot >= info_.n_slots) {
            return 0;
        }
        return llama_memory_seq_pos_max(memory(), slot) + 1;
    }

    // empties the slot: no positions, nothing to restore
    void clear(int32_t slot) {
        llama_memory_seq_rm(memory(), slot, -1, -1);
        depth_.cleared(slot);
        if (drafter_) {
            drafter_->clear(slot);
        }
    }

    // deepseek4 drops positions only as far back as its snapshots reach
    bool snapshots_limit_discards() const { return info_.discard_depth > 0; }
    // an attention KV cache drops any suffix exactly
    bool drops_any_suffix() const { return info_.can_discard && info_.discard_depth == 0; }

    step_result check(const step_request & request) const;

    // decodes the requests as one batch; false when the decode failed as a whole, with
    // every slot of the group back where it was before
    bool decode(const std::vector<step_request> & requests, const std::vector<size_t> & group,
                std::vector<step_result> & results, int32_t & rc);

    engine_info       info_;
    llama_model_ptr   model_;
    llama_context_ptr ctx_;
    int32_t           n_batch_;
    llama_batch_ext_ptr batch_;
    rollback_depth    depth_;    // deepseek4: what each slot can drop now (unused at depth 0)
    bool              model_needs_ids_; // the owned layers route by token id (the drafter aside)
    std::unique_ptr<tail_drafter> drafter_; // last stage: MTP layers, a DSpark GGUF, or none
    mutable std::mutex mutex_;
    mutable std::once_flag specials_once_;
    mutable std::vector<special_token> specials_; // the vocabulary's, as its tokenizer tries them
};

discard_result llama_engine::slot_discard(int32_t slot, int32_t from) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!info_.can_discard || slot < 0 || slot >= info_.n_slots) {
        return {discard_status::unsupported, 0};
    }
    const int32_t held = n_past(slot);
    if (from >= held) {
        return {};
    }
    if (from <= 0) {
        clear(slot); // dropping everything is exact on any memory
        return {};
    }
    const int32_t n = held - from;
    if (snapshots_limit_discards() && !depth_.can_drop(slot, n)) {
        return {discard_status::too_deep, depth_.restorable(slot)};
    }
    if (!llama_memory_seq_rm(memory(), slot, from, -1)) {
        // the memory keeps the same account as depth_; refused, it changed nothing
        return {discard_status::too_deep, 0};
    }
    depth_.dropped(slot, n);
    if (drafter_) {
        drafter_->discard(slot, from);
    }
    return {};
}

step_result llama_engine::check(const step_request & request) const {
    if (request.slot < 0 || request.slot >= info_.n_slots) {
        return failure(engine_status::invalid_argument,
                       "slot " + std::to_string(request.slot) + " is outside 0.." + std::to_string(info_.n_slots - 1));
    }
    const size_t n_tokens = request.positions.size();
    if (n_tokens == 0) {
        return failure(engine_status::invalid_argument, "a step needs at least one position");
    }
    if (n_tokens > static_cast<size_t>(n_batch_)) {
        return failure(engine_status::invalid_argument, "a step holds at most " + std::to_string(n_batch_) +
                       " tokens per session, got " + std::to_string(n_tokens));
    }
    if (info_.is_first()) {
        if (request.tokens.size() != n_tokens) {
            return failure(engine_status::invalid_argument, "the first stage needs one token id per position");
        }
        if (!request.boundary.empty()) {
            return failure(engine_status::invalid_argument, "the first stage takes token ids, not a boundary");
        }
        for (int32_t token : request.tokens) {
            if (token < 0 || token >= info_.n_vocab) {
                return failure(engine_status::invalid_argument, "token id " + std::to_string(token) +
                               " is outside the vocabulary of " + std::to_string(info_.n_vocab));
            }
        }
    } else {
        if (request.boundary.size() != n_tokens * static_cast<size_t>(info_.boundary_row)) {
            return failure(engine_status::invalid_argument, "the boundary needs " + std::to_string(n_tokens) + " x " +
                           std::to_string(info_.boundary_row) + " floats, got " + std::to_string(request.boundary.size()));
        }
        if (info_.needs_token_sideband && request.tokens.size() != n_tokens) {
            return failure(engine_status::invalid_argument, "layers " + info_.layers.str() +
                           " route experts by token id: the step needs one token id per position beside the boundary");
        }
        if (!request.tokens.empty() && request.tokens.size() != n_tokens) {
            return failure(engine_status::invalid_argument, "token ids beside a boundary need one per position");
        }
        if (info_.needs_token_sideband) {
            for (int32_t token : request.tokens) {
                if (token < 0 || token >= info_.n_vocab) {
                    return failure(engine_status::invalid_argument, "token id " + std::to_string(token) +
                                   " is outside the vocabulary of " + std::to_string(info_.n_vocab));
                }
            }
        }
        for (float value : request.boundary) {
            if (!std::isfinite(value)) {
                return failure(engine_status::invalid_argument, "the boundary holds a NaN or infinite value");
            }
        }
    }
    if (info_.is_last()) {
        for (int32_t row : request.output_rows) {
            if (row < 0 || static_cast<size_t>(row) >= n_tokens) {
                return failure(engine_status::invalid_argument, "output row " + std::to_string(row) +
                               " is outside the step's " + std::to_string(n_tokens) + " rows");
            }
        }
    }
    const int32_t past = n_past(request.slot);
    if (request.positions[0] != past) {
        return failure(engine_status::cache_miss, "slot " + std::to_string(request.slot) + " holds " +
                       std::to_string(past) + " positions, the step starts at " + std::to_string(request.positions[0]));
    }
    for (size_t i = 1; i < n_tokens; ++i) {
        if (request.positions[i] != request.positions[0] + static_cast<int32_t>(i)) {
            return failure(engine_status::invalid_argument, "positions must be consecutive");
        }
    }
    if (static_cast<int64_t>(past) + static_cast<int64_t>(n_tokens) > info_.n_ctx) {
        return failure(engine_status::context_overflow, "slot " + std::to_string(request.slot) + " would hold " +
                       std::to_string(past + static_cast<int64_t>(n_tokens)) + " positions, the context holds " +
                       std::to_string(info_.n_ctx));
    }
    return step_result{};
}

bool llama_engine::decode(const std::vector<step_request> & requests, const std::vector<size_t> & group,
                          std::vector<step_result> & results, int32_t & rc) {
    llama_batch_ext * batch = batch_.get();
    llama_batch_ext_clear(batch);

    const size_t row_floats = static_cast<size_t>(info_.boundary_row);
    std::vector<int32_t> first_index(group.size());
    for (size_t g = 0; g < group.size(); ++g) {
        const step_request & request = requests[group[g]];
        std::vector<bool> wanted(request.positions.size(), !info_.is_last());
        for (int32_t row : request.output_rows) {
            wanted[static_cast<size_t>(row)] = true;
        }
        for (size_t i = 0; i < request.positions.size(); ++i) {
            int32_t index;
            if (info_.is_first()) {
                index = llama_batch_ext_add_token(batch, request.slot, request.tokens[i]);
            } else {
                const llama_embd row = { request.boundary.data() + i * row_floats, 1, row_floats };
                if (model_needs_ids_) { // an entry with both the token id and the boundary
                    index = llama_batch_ext_add_token(batch, request.slot, request.tokens[i]);
                    if (index >= 0 && !llama_batch_ext_set_embd_token(batch, index, row)) {
                        index = -1;
                    }
                } else {
                    index = llama_batch_ext_add_embd(batch, request.slot, row);
                }
            }
            if (index < 0 || !llama_batch_ext_set_pos(batch, index, &request.positions[i]) ||
                !llama_batch_ext_set_output_logits(batch, index, wanted[i])) {
                rc = -1;
                return false;
            }
            if (i == 0) {
                first_index[g] = index;
            }
        }
    }

    rc = llama_process(ctx_.get(), LLAMA_PROCESS_TYPE_DECODE, batch);
    if (rc != 0) {
        // 1 and -1 leave the memory as it was; other failures may keep finished ubatches, and a
        // memory that cannot drop them exactly (deepseek4's compressor state and snapshots, maybe
        // half written) loses the whole slot
        for (size_t r : group) {
            const int32_t slot = requests[r].slot;
            if (!slot_rollback(memory(), slot, requests[r].positions[0], rc, drops_any_suffix())) {
                depth_.cleared(slot);
                results[r] = failure(engine_status::cache_miss, "the failed step could not be undone in slot " +
                                     std::to_string(slot) + "; the slot was cleared");
            }
        }
        return false;
    }
    for (size_t r : group) {
        depth_.stepped(requests[r].slot, static_cast<int32_t>(requests[r].positions.size()));
    }
    if (drafter_) {
        std::vector<drafter_step> fed(group.size());
        for (size_t g = 0; g < group.size(); ++g) {
            const step_request & request = requests[group[g]];
            fed[g] = { request.slot, request.positions[0], &request.tokens, first_index[g],
                       static_cast<int32_t>(request.positions.size()) };
        }
        drafter_->stepped(fed);
    }

    for (size_t g = 0; g < group.size(); ++g) {
        const step_request & request = requests[group[g]];
        step_result & result = results[group[g]];
        if (!info_.is_last()) {
            result.boundary.resize(request.positions.size() * row_floats);
            for (size_t i = 0; i < request.positions.size(); ++i) {
                const float * row = llama_get_boundary_ith(ctx_.get(), first_index[g] + static_cast<int32_t>(i));
                if (row == nullptr) {
                    result = failure(engine_status::internal, "llama.cpp returned no boundary row");
                    clear(request.slot);
                    break;
                }
                std::memcpy(result.boundary.data() + i * row_floats, row, row_floats * sizeof(float));
            }
            continue;
        }
        const size_t n_vocab = static_cast<size_t>(info_.n_vocab);
        result.logits.resize(request.output_rows.size() * n_vocab);
        for (size_t k = 0; k < request.output_rows.size(); ++k) {
            const float * row = llama_get_logits_ith(ctx_.get(), first_index[g] + request.output_rows[k]);
            if (row == nullptr) {
                result = failure(engine_status::internal, "llama.cpp returned no logits row");
                clear(request.slot);
                break;
            }
            std::memcpy(result.logits.data() + k * n_vocab, row, n_vocab * sizeof(float));
        }
    }
    return true;
}

std::vector<step_result> llama_engine::step(const std::vector<step_request> & requests) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<step_result> results(requests.size());

    // admit the valid requests, at most one per slot, into groups that fit one decode
    std::vector<std::vector<size_t>> groups;
    std::vector<bool> slot_taken(static_cast<size_t>(info_.n_slots), false);
    size_t group_tokens = 0;
    for (size_t r = 0; r < requests.size(); ++r) {
        results[r] = check(requests[r]);
        if (results[r].status != engine_status::ok) {
            continue;
        }
        if (slot_taken[static_cast<size_t>(requests[r].slot)]) {
            results[r] = failure(engine_status::invalid_argument,
                                 "slot " + std::to_string(requests[r].slot) + " appears twice in one step");
            continue;
        }
        slot_taken[static_cast<size_t>(requests[r].slot)] = true;
        const size_t n_tokens = requests[r].positions.size();
        if (groups.empty() || group_tokens + n_tokens > static_cast<size_t>(n_batch_)) {
            groups.emplace_back();
            group_tokens = 0;
        }
        groups.back().push_back(r);
        group_tokens += n_tokens;
    }

    for (const std::vector<size_t> & group : groups) {
        int32_t rc = 0;
        if (decode(requests, group, results, rc)) {
            continue;
        }
        // the batch failed as a whole: run each session alone, so one cannot fail another
        for (size_t r : group) {
            if (results[r].status == engine_status::cache_miss) {
                continue; // cleared: the caller re-prefills
            }
            if (group.size() > 1 && decode(requests, {r}, results, rc)) {
                continue;
            }
            if (results[r].status == engine_status::cache_miss) {
                continue;
            }
            if (rc == 1) {
                results[r] = failure(engine_status::capacity_exhausted, "no free KV cells for the step");
            } else if (rc == -1) {
                results[r] = failure(engine_status::invalid_argument, "llama.cpp refused the batch");
            } else {
                clear(requests[r].slot);
                results[r] = failure(engine_status::internal,
                                     "decode failed (" + std::to_string(rc) + "); the slot was cleared");
            }
        }
    }
    return results;
}

namespace {

// `text`'s tokens, every special token in it parsed (parse_special) or none.
engine_status tokenize_text(const llama_vocab * vocab, std::string_view text, bool add_special, bool parse_special,
                            std::vector<int32_t> & out) {
    const int32_t text_len = static_cast<int32_t>(text.size());
    // Tokenizing is the cost: one pass when the guess holds them (text rarely has more
    // tokens than bytes), a second only when it does not.
    std::vector<int32_t> tokens(std::min<size_t>(text.size() + 16, 1 << 20));
    int32_t n = llama_tokenize(vocab, text.data(), text_len, tokens.data(), static_cast<int32_t>(tokens.size()),
                               add_special, parse_special);
    if (n == INT32_MIN) {
        return engine_status::invalid_argument;
    }
    if (n < 0) {
        tokens.resize(static_cast<size_t>(-n));
        n = llama_tokenize(vocab, text.data(), text_len, tokens.data(), static_cast<int32_t>(tokens.size()),
                           add_special, parse_special);
    }
    if (n < 0) {
        return engine_status::internal;
    }
    out.insert(out.end(), tokens.begin(), tokens.begin() + n);
    return engine_status::ok;
}

// The tokens llama.cpp's tokenizer splits out first (control, user-defined and unknown),
// in the order it tries them: the same sort of the same ids, longest text first.
std::vector<special_token> vocab_specials(const llama_vocab * vocab) {
    const int32_t split_first = LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_USER_DEFINED | LLAMA_TOKEN_ATTR_UNKNOWN;
    std::vector<llama_token> ids;
    for (llama_token id = 0; id < llama_vocab_n_tokens(vocab); ++id) {
        if (llama_vocab_get_attr(vocab, id) & split_first) {
            ids.push_back(id);
        }
    }
    std::sort(ids.begin(), ids.end(), [vocab](llama_token a, llama_token b) {
        return std::strlen(llama_vocab_get_text(vocab, a)) > std::strlen(llama_vocab_get_text(vocab, b));
    });
    std::vector<special_token> specials;
    for (llama_token id : ids) {
        const int32_t attr = llama_vocab_get_attr(vocab, id);
        specials.push_back({llama_vocab_get_text(vocab, id), id,
                            (attr & (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_UNKNOWN)) != 0,
                            (attr & LLAMA_TOKEN_ATTR_LSTRIP) != 0, (attr & LLAMA_TOKEN_ATTR_RSTRIP) != 0});
    }
    return specials;
}

} // namespace

engine_status llama_engine::tokenize(const std::string & text, bool add_special, const std::vector<text_range> & literal,
                                     std::vector<int32_t> & out) const {
    const llama_vocab * vocab = llama_model_get_vocab(model_.get());
    out.clear();
    if (literal.empty()) {
        return tokenize_text(vocab, text, add_special, /*parse_special =*/ true, out);
    }
    if (!literal_ranges_valid(literal, text.size())) {
        return engine_status::invalid_argument;
    }
    // The special tokens found outside the literal ranges, then each raw piece without
    // specials: what llama.cpp does with the whole text, less the matches it may not make.
    std::call_once(specials_once_, [this, vocab] { specials_ = vocab_specials(vocab); });
    const bool bos = add_special && llama_vocab_get_add_bos(vocab);
    const bool eos = add_special && llama_vocab_get_add_eos(vocab);
    if (bos) {
        out.push_back(llama_vocab_bos(vocab));
    }
    for (const text_piece & piece : split_specials(text, specials_, literal)) {
        if (piece.token >= 0) {
            out.push_back(piece.token);
            continue;
        }
        const std::string_view raw = std::string_view(text).substr(piece.begin, piece.end - piece.begin);
        const engine_status status = tokenize_text(vocab, raw, /*add_special =*/ false, /*parse_special =*/ false, out);
        if (status != engine_status::ok) {
            out.clear();
            return status;
        }
    }
    if (eos) {
        out.push_back(llama_vocab_eos(vocab));
    }
    return engine_status::ok;
}

engine_status llama_engine::detokenize(const std::vector<int32_t> & tokens, std::string & out) const {
    const llama_vocab * vocab = llama_model_get_vocab(model_.get());
    for (int32_t token : tokens) {
        if (token < 0 || token >= info_.n_vocab) {
            return engine_status::invalid_argument;
        }
    }
    const int32_t n_tokens = static_cast<int32_t>(tokens.size());
    out.assign(tokens.size() * 8 + 16, '\0');
    int32_t n = llama_detokenize(vocab, tokens.data(), n_tokens, out.data(), static_cast<int32_t>(out.size()), false, false);
    if (n < 0) {
        out.assign(static_cast<size_t>(-n), '\0');
        n = llama_detokenize(vocab, tokens.data(), n_tokens, out.data(), static_cast<int32_t>(out.size()), false, false);
    }
    if (n < 0) {
        out.clear();
        return engine_status::internal;
    }
    out.resize(static_cast<size_t>(n));
    return engine_status::ok;
}

} // namespace

engine_ptr llama_engine_init(const engine_params & params, std::string & error) {
    gguf_facts facts;
    if (!gguf_facts_read(params.model_path, facts, error)) {
        return nullptr;
    }
    const layer_range range = { params.layers.begin, params.layers.end == layer_range::to_n_layer ? facts.n_layer : params.layers.end };
    const std::string range_problem = layer_range_check(range, facts.n_layer);
    if (!range_problem.empty()) {
        error = range_problem;
        return nullptr;
    }
    const std::string drafter_refusal = drafter_problem(params, facts, range);
    if (!drafter_refusal.empty()) {
        error = drafter_refusal;
        return nullptr;
    }
    if (params.n_ctx <= 0 || params.n_slots <= 0 || params.n_batch <= 0 || params.n_threads < 0) {
        error = "n_ctx, n_slots and n_batch must be positive, n_threads non-negative";
        return nullptr;
    }

    if (!backends_init(error)) {
        return nullptr;
    }

    llama_model_params mparams = llama_model_default_params();
    mparams.layer_begin  = range.begin;
    mparams.layer_end    = range.end;
    mparams.n_gpu_layers = params.n_gpu_layers;
    // read only the owned tensors into buffers of their own: no mapping of the whole file
    mparams.load_mode    = LLAMA_LOAD_MODE_NONE;
    // no repacked CPU weight copies: at the pin the AMX repack path crashes on our build
    // machines (llama-bench too, unless --repack 0), and the plain layout keeps the stage
    // footprint equal to the tensors it owns
    mparams.use_extra_bufts = false;
    mparams.load_mtp        = drafter_loads_mtp(params.drafter);

    llama_model_ptr model;
    {
        load_log_capture capture;
        model.reset(llama_model_load_from_file(params.model_path.c_str(), mparams));
        if (!model) {
            const std::string reason = capture.last_error();
            error = "llama.cpp could not load layers " + range.str() + " of " + params.model_path +
                    (reason.empty() ? "" : ": " + reason);
            return nullptr;
        }
    }

    const int32_t n_threads = params.n_threads > 0 ? params.n_threads : default_threads();
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx           = static_cast<uint32_t>(params.n_ctx) * static_cast<uint32_t>(params.n_slots);
    cparams.n_seq_max       = static_cast<uint32_t>(params.n_slots);
    // One KV stream per slot, never one pool shared by every slot: in a shared pool a
    // session's cells land wherever the other sessions left room (wrapping around its
    // end), and flash attention accumulates over the cells in cell order, so a user's
    // answer would depend on what other users sent. A stream of its own starts every
    // session at cell 0, as it would alone. (llama.cpp runs a batch over separate streams
    // as runs of consecutive slot ids; deepseek4's memory is per sequence either way.)
    cparams.kv_unified      = false;
    cparams.n_batch         = static_cast<uint32_t>(params.n_batch);
    cparams.n_ubatch        = static_cast<uint32_t>(params.n_batch);
    cparams.n_threads       = n_threads;
    cparams.n_threads_batch = n_threads;
    cparams.no_perf         = true;
    // deepseek4 drops a session's last positions by restoring snapshots of its compressed
    // state, discard_depth of them per slot; other memories drop any suffix, or none
    const bool snapshots = facts.arch == "deepseek4";
    if (snapshots && (params.discard_depth < 0 || params.discard_depth >= params.n_batch)) {
        error = "the discard depth must be between 0 and the batch less one (" +
                std::to_string(params.n_batch - 1) + "), got " + std::to_string(params.discard_depth);
        return nullptr;
    }
    cparams.n_rs_seq        = snapshots ? static_cast<uint32_t>(params.discard_depth) : 0;

    llama_context_ptr ctx;
    {
        load_log_capture capture;
        ctx.reset(llama_init_from_model(model.get(), cparams));
        if (!ctx) {
            error = "llama.cpp could not create a context of " + std::to_string(params.n_slots) + " x " +
                    std::to_string(params.n_ctx) + " positions for layers " + range.str();
            return nullptr;
        }
    }

    engine_info info;
    info.arch         = facts.arch;
    info.n_layer      = llama_model_n_layer(model.get());
    info.layers.begin = llama_model_layer_begin(model.get());
    info.layers.end   = llama_model_layer_end(model.get());
    info.n_embd       = llama_model_n_embd(model.get());
    info.n_vocab      = llama_vocab_n_tokens(llama_model_get_vocab(model.get()));
    info.has_vocab    = info.n_vocab > 0;
    // the residual crossing a seam: n_embd per token, or deepseek4's hc streams of n_embd
    info.boundary_row = llama_model_n_embd_out(model.get());
    info.schema       = info.boundary_row == info.n_embd ? boundary_schema::dense_residual
                                                         : boundary_schema::mhc_residual;
    info.needs_token_sideband = llama_model_needs_token_ids(model.get());
    if (!info.is_first() && llama_model_n_embd_inp(model.get()) != info.boundary_row) {
        error = "layers " + range.str() + " take " + std::to_string(llama_model_n_embd_inp(model.get())) +
                " values per token, the boundary holds " + std::to_string(info.boundary_row);
        return nullptr;
    }
    info.n_ctx        = static_cast<int32_t>(llama_n_ctx(ctx.get()) / llama_n_seq_max(ctx.get())); // per slot
    info.n_slots      = static_cast<int32_t>(llama_n_seq_max(ctx.get()));
    info.weight_bytes = llama_model_buffer_size(model.get());
    info.kv_bytes     = llama_memory_buffer_size(llama_get_memory(ctx.get()));
    // An attention KV cache drops any suffix of a sequence; recurrent state cannot go back,
    // and deepseek4's compressed caches go back only as far as their snapshots, once.
    if (snapshots) {
        info.can_discard   = llama_n_rs_seq(ctx.get()) > 0;
        info.discard_depth = static_cast<int32_t>(llama_n_rs_seq(ctx.get()));
        info.discard_bytes = info.can_discard ? discard_bytes_per_slot(model.get(), cparams, llama_n_rs_seq(ctx.get())) : 0;
        // its memory copies a whole sequence (compressed state included), never a part
        info.can_copy_prefix   = true;
        info.copies_whole_only = true;
    } else {
        info.can_discard   = !llama_model_is_recurrent(model.get()) && !llama_model_is_hybrid(model.get());
        // an attention KV cache copies a stream and drops any suffix of it exactly
        info.can_copy_prefix = info.can_discard;
    }

    const int32_t n_batch = static_cast<int32_t>(llama_n_batch(ctx.get()));
    hosted_drafter hosted;
    if (!drafter_build(params, facts, info, drafter_host{model.get(), ctx.get(), n_batch, n_threads}, hosted, error)) {
        return nullptr;
    }
    info.drafter               = hosted.facts;
    info.weight_bytes         += hosted.own_weight_bytes; // the stage's footprint holds it
    info.needs_token_sideband  = info.needs_token_sideband || hosted.needs_token_ids;
    return std::make_unique<llama_engine>(std::move(info), std::move(model), std::move(ctx), n_batch, std::move(hosted.drafter));
}

} // namespace meshnet
