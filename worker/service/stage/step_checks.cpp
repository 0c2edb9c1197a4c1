// step_checks.cpp - see step_checks.h. Messages say what was wrong and what the stage
// takes, so a driver's log line is enough to fix the request.
#include "step_checks.h"

#include "draft_verify.h"
#include "layer_range.h"
#include "loop_drafts.h"
#include "loop_pipeline.h"
#include "proto_convert.h"

#include <algorithm>
#include <vector>

namespace meshnet {

namespace {

std::optional<shard_error> check_layers(const pb::ForwardRequest & request, const engine_info & info) {
    if (request.has_expected_range() &&
        (request.expected_range().begin() != info.layers.begin || request.expected_range().end() != info.layers.end)) {
        const std::string mine = info.layers.str();
        const layer_range expected{request.expected_range().begin(), request.expected_range().end()};
        return make_error(error_reason::range_mismatch,
            "this stage owns layers " + mine + ", the route expects " + expected.str(),
            {{"stage_range", mine}});
    }
    return std::nullopt;
}

std::optional<shard_error> check_positions(const pb::ForwardRequest & request, const stage_facts & stage) {
    const int64_t n_past = request.n_past();
    const int64_t n      = request.positions_size();
    if (n == 0) {
        return make_error(error_reason::invalid_positions, "a step needs at least one position");
    }
    if (n > stage.max_step_tokens) {
        return make_error(error_reason::step_too_large,
            std::to_string(n) + " tokens in one step; split it",
            {{"max_step_tokens", std::to_string(stage.max_step_tokens)}});
    }
    if (n_past < 0) {
        return make_error(error_reason::invalid_positions, "n_past must not be negative");
    }
    for (int64_t i = 0; i < n; ++i) {
        if (request.positions(static_cast<int>(i)) != n_past + i) {
            return make_error(error_reason::invalid_positions,
                "positions must be n_past, n_past+1, ...: position " + std::to_string(i) + " is " +
                std::to_string(request.positions(static_cast<int>(i))) + ", expected " + std::to_string(n_past + i));
        }
    }
    if (auto error = check_discard(request, stage.info)) {
        return error;
    }
    if (n_past + n > stage.info.n_ctx) {
        return make_error(error_reason::context_overflow,
            "positions up to " + std::to_string(n_past + n) + " exceed the context of " +
            std::to_string(stage.info.n_ctx),
            {{"n_ctx", std::to_string(stage.info.n_ctx)}});
    }
    return std::nullopt;
}

std::optional<shard_error> check_tokens(const pb::ForwardRequest & request, const engine_info & info) {
    const bool wants_tokens = info.is_first() || info.needs_token_sideband;
    if (!wants_tokens && request.tokens_size() == 0) {
        return std::nullopt;
    }
    if (request.tokens_size() != request.positions_size()) {
        return make_error(error_reason::invalid_tokens,
            std::to_string(request.tokens_size()) + " token ids for " + std::to_string(request.positions_size()) +
            " positions");
    }
    for (int32_t token : request.tokens()) {
        if (token < 0 || token >= info.n_vocab) {
            return make_error(error_reason::invalid_tokens,
                "token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                std::to_string(info.n_vocab) + ")");
        }
    }
    return std::nullopt;
}

std::string dims(const std::vector<int64_t> & shape) {
    std::string out;
    for (int64_t d : shape) out += (out.empty() ? "" : ",") + std::to_string(d);
    return out;
}

// The boundary's presence, schema, dtype and shape; its bytes are checked as they decode.
std::optional<shard_error> check_boundary(const pb::ForwardRequest & request, const stage_facts & stage) {
    const engine_info & info = stage.info;
    if (info.is_first()) {
        if (request.has_boundary()) {
            return make_error(error_reason::invalid_boundary, "the first stage takes token ids, not a boundary");
        }
        return std::nullopt;
    }
    if (!request.has_boundary()) {
        return make_error(error_reason::invalid_boundary, "this stage needs the previous stage's boundary");
    }
    const pb::Boundary & boundary = request.boundary();
    if (boundary.schema() != schema_to_pb(info.schema)) {
        return make_error(error_reason::boundary_schema_mismatch,
            std::string("boundary schema ") + pb::BoundarySchema_Name(boundary.schema()) + ", this stage takes " +
            pb::BoundarySchema_Name(schema_to_pb(info.schema)));
    }
    if (boundary.dtype() != dtype_to_pb(stage.boundary_dtype)) {
        return make_error(error_reason::boundary_schema_mismatch,
            std::string("boundary dtype ") + pb::BoundaryDtype_Name(boundary.dtype()) + ", this stage takes " +
            pb::BoundaryDtype_Name(dtype_to_pb(stage.boundary_dtype)));
    }
    std::vector<int64_t> expected{request.positions_size()};
    for (int64_t dim : row_shape(info)) expected.push_back(dim);
    const std::vector<int64_t> shape(boundary.shape().begin(), boundary.shape().end());
    if (shape != expected) {
        return make_error(error_reason::invalid_boundary,
            "boundary shape [" + dims(shape) + "], expected [" + dims(expected) + "]");
    }
    return std::nullopt;
}

// What the last stage is asked to answer: rows, kind, top-k, sampling.
std::optional<shard_error> check_last_output(const pb::ForwardRequest & request, const engine_info & info) {
    const pb::OutputRequest & output = request.output();
    const int64_t n = request.positions_size();
    if (output.kind() == pb::OUTPUT_KIND_BOUNDARY) {
        return make_error(error_reason::invalid_output_request, "the last stage answers logits, top-k or samples");
    }
    // Rows in increasing order, each once: a request asks for at most its own rows,
    // so what its answer holds is bounded by the step limit (rows x n_vocab).
    for (int i = 0; i < output.rows_size(); ++i) {
        const int32_t row = output.rows(i);
        if (row < 0 || row >= n) {
            return make_error(error_reason::invalid_output_request,
                "row " + std::to_string(row) + " is outside the step's " + std::to_string(n) + " rows");
        }
        if (i > 0 && row <= output.rows(i - 1)) {
            return make_error(error_reason::invalid_output_request,
                "output rows must increase, each asked once (row " + std::to_string(row) + " after " +
                std::to_string(output.rows(i - 1)) + ")");
        }
    }
    if (output.kind() == pb::OUTPUT_KIND_VERIFIED && (output.rows_size() > 0 || request.tokens_size() != n)) {
        return make_error(error_reason::invalid_output_request,
            "VERIFIED checks every row against the step's tokens: no rows, and the tokens given");
    }
    if (output.kind() == pb::OUTPUT_KIND_TOP_K && (output.top_k() < 1 || output.top_k() > info.n_vocab)) {
        return make_error(error_reason::invalid_output_request, "top_k must be within [1, n_vocab]");
    }
    if (output.kind() == pb::OUTPUT_KIND_SAMPLED || output.kind() == pb::OUTPUT_KIND_VERIFIED) {
        const pb::SamplingParams & sampling = output.sampling();
        if (!(sampling.temperature() >= 0.0f) || sampling.top_k() < 0 ||
            !(sampling.top_p() >= 0.0f && sampling.top_p() <= 1.0f)) {
            return make_error(error_reason::invalid_output_request,
                "sampling needs temperature >= 0, top_k >= 0 and top_p within [0, 1]");
        }
    }
    return std::nullopt;
}

std::optional<shard_error> check_output(const pb::ForwardRequest & request, const stage_facts & stage) {
    const engine_info & info = stage.info;
    if (info.is_last()) {
        return check_last_output(request, info);
    }
    if (request.relay()) {
        if (!stage.has_next_stage) {
            return make_error(error_reason::relay_unavailable,
                "this stage was started without --next-stage; call each stage in turn");
        }
        return std::nullopt; // the last stage checks the output it is asked for
    }
    const pb::OutputKind kind = request.output().kind();
    if (kind != pb::OUTPUT_KIND_UNSPECIFIED && kind != pb::OUTPUT_KIND_BOUNDARY) {
        return make_error(error_reason::invalid_output_request,
            std::string(pb::OutputKind_Name(kind)) + " asked of a non-last stage (layers " + info.layers.str() +
            " of " + std::to_string(info.n_layer) + "); it answers only its boundary");
    }
    return std::nullopt;
}

// What an answer holds besides its rows or boundary: n_past, timings, the chain's traces
// and the stream's or relay's framing.
constexpr int64_t answer_envelope_bytes = 1024;
// A row's framing in the answer: LogitsRow's tags, lengths and index (or a sampled id).
constexpr int64_t answer_row_bytes = 24;

// The answer must fit one message (protobuf cannot even build one of 2 GiB): the rows
// asked of the last stage, or the boundary a non-last stage answers or relays. Checked
// before the step runs, so that no step computes what it cannot send.
std::optional<shard_error> check_answer_size(const pb::ForwardRequest & request, const stage_facts & stage) {
    const engine_info & info  = stage.info;
    const int64_t       limit = stage.max_message_bytes;
    const int64_t       n     = request.positions_size();
    // `count` of `what`, `unit_bytes` each: refused with how many fit, when they do not.
    const auto fit = [&](const char * subject, int64_t count, const std::string & what, int64_t unit_bytes,
                         const char * verb, const char * key, const char * hint) -> std::optional<shard_error> {
        const int64_t bytes = answer_envelope_bytes + count * unit_bytes;
        if (bytes <= limit) {
            return std::nullopt;
        }
        const int64_t fits = std::max<int64_t>(0, (limit - answer_envelope_bytes) / unit_bytes);
        return make_error(error_reason::response_too_large,
            std::string(subject) + std::to_string(count) + " " + what + " would take " + std::to_string(bytes) +
            " bytes, over the message limit of " + std::to_string(limit) + "; " + verb + " at most " +
            std::to_string(fits) + " " + what + " in one step" + hint,
            {{"max_message_bytes", std::to_string(limit)}, {key, std::to_string(fits)}});
    };
    if (!info.is_last()) {
        const int64_t token_bytes = info.boundary_row * static_cast<int64_t>(wire_dtype_size(stage.boundary_dtype));
        return fit("the boundary of ", n, "tokens", token_bytes, "send", "max_tokens", "");
    }
    const pb::OutputRequest & output = request.output();
    const int64_t rows = output.kind() == pb::OUTPUT_KIND_VERIFIED ? n : std::max(1, output.rows_size());
    switch (output.kind()) {
        case pb::OUTPUT_KIND_UNSPECIFIED:
        case pb::OUTPUT_KIND_LOGITS:
            return fit("the answer's ", rows, "rows of logits", answer_row_bytes + 4 * int64_t{info.n_vocab}, "ask for",
                       "max_rows", " (or top-k, or sampled tokens)");
        case pb::OUTPUT_KIND_TOP_K: // a float and a token id of up to 5 bytes per entry
            return fit("the answer's ", rows, "rows of top-" + std::to_string(output.top_k()),
                       answer_row_bytes + 9 * int64_t{output.top_k()}, "ask for", "max_rows", " (or a smaller top_k)");
        default:
            return fit("the answer's ", rows, "sampled rows", answer_row_bytes, "ask for", "max_rows", "");
    }
}

// A speculative loop's request (ForwardRequest.loop_drafts) this stage can run.
std::optional<shard_error> check_loop_drafts(const pb::ForwardRequest & request, const engine_info & info,
                                             bool streaming) {
    if (request.loop_drafts() == 0) {
        if (request.draft_context_size() > 0 || request.loop_windows() > 0) {
            return make_error(error_reason::invalid_output_request,
                              "draft_context and loop_windows are for a speculative loop (loop_drafts)");
        }
        return std::nullopt;
    }
    const char * problem =
        !streaming || !info.is_first() ? "loop_drafts is for a decode loop on the first stage (ForwardStream)" :
        request.loop_drafts() > max_loop_drafts ? "loop_drafts is at most 7 (the widest exact verification step)" :
        request.loop_windows() > max_loop_windows ? "loop_windows is at most 8" :
        nullptr;
    if (problem) {
        return make_error(error_reason::invalid_output_request, problem);
    }
    if (!info.can_discard) {
        return make_error(error_reason::discard_unsupported,
            "this stage cannot drop a suffix of a session's positions; a speculative loop needs it");
    }
    for (int32_t token : request.draft_context()) {
        if (token < 0 || token >= info.n_vocab) {
            return make_error(error_reason::invalid_tokens,
                "draft_context token id " + std::to_string(token) + " is outside the vocabulary");
        }
    }
    return std::nullopt;
}

// A decode loop (continue_tokens): on the first stage's stream, sampling its last row. A
// non-last stage that does not relay was refused its sampled output by check_output.
std::optional<shard_error> check_decode_loop(const pb::ForwardRequest & request, const engine_info & info,
                                             bool streaming) {
    if (request.continue_tokens() == 0) {
        return std::nullopt;
    }
    const pb::OutputRequest & output = request.output();
    const bool last_row_only = output.rows().empty() ||
        (output.rows_size() == 1 && output.rows(0) == request.positions_size() - 1);
    const bool verified_loop = output.kind() == pb::OUTPUT_KIND_VERIFIED && request.loop_drafts() > 0;
    const char * problem =
        !streaming ? "continue_tokens works on ForwardStream only" :
        !info.is_first() ? "continue_tokens needs the first stage (it embeds the sampled tokens)" :
        output.kind() != pb::OUTPUT_KIND_SAMPLED && !verified_loop ? "continue_tokens needs OUTPUT_KIND_SAMPLED" :
        !last_row_only ? "continue_tokens samples the last row only" : nullptr;
    if (problem) {
        return make_error(error_reason::invalid_output_request, problem);
    }
    return std::nullopt;
}

} // namespace

std::optional<shard_error> check_route_key(const pb::RouteKey & key, const stage_facts & stage) {
    if (key.session_id().empty() || key.session_id().size() > 256) {
        return make_error(error_reason::invalid_route_key, "session_id must hold 1..256 bytes");
    }
    if (key.route_id() != stage.route_id) {
        return make_error(error_reason::route_mismatch,
            "this worker serves route '" + stage.route_id + "', not '" + key.route_id() + "'",
            {{"stage_route_id", stage.route_id}});
    }
    if (key.epoch() != stage.epoch) {
        return make_error(error_reason::epoch_mismatch,
            "this worker serves epoch " + std::to_string(stage.epoch) + ", the request carries " +
            std::to_string(key.epoch()),
            {{"stage_epoch", std::to_string(stage.epoch)}});
    }
    return std::nullopt;
}

std::optional<shard_error> check_step(const pb::ForwardRequest & request, const stage_facts & stage,
                                      bool streaming) {
    const int64_t size = static_cast<int64_t>(request.ByteSizeLong());
    if (size > stage.max_message_bytes) {
        return make_error(error_reason::message_too_large,
            "request of " + std::to_string(size) + " bytes is over the limit",
            {{"max_message_bytes", std::to_string(stage.max_message_bytes)}});
    }
    if (!request.has_key()) {
        return make_error(error_reason::invalid_route_key, "the request carries no RouteKey");
    }
    if (auto error = check_route_key(request.key(), stage)) return error;
    if (auto error = check_layers(request, stage.info)) return error;
    if (auto error = check_positions(request, stage)) return error;
    if (auto error = check_tokens(request, stage.info)) return error;
    if (auto error = check_boundary(request, stage)) return error;
    if (auto error = check_output(request, stage)) return error;
    if (auto error = check_answer_size(request, stage)) return error;
    if (auto error = check_loop_drafts(request, stage.info, streaming)) return error;
    return check_decode_loop(request, stage.info, streaming);
}

} // namespace meshnet
