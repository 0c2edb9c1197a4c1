// test-step-checks.cpp - every reason a stage refuses a step before queueing it, as a
// table: a valid step for a stage, one change, and the reason answered (or none).
#include "service_test.h"
#include "step_checks.h"

#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

using namespace meshnet;

namespace {

enum class stage_kind { only, first, middle, last };

constexpr int32_t n_embd = 8;

stage_facts stage_of(stage_kind kind) {
    stage_facts stage;
    engine_info & info = stage.info;
    info.arch         = "fake";
    info.n_layer      = 4;
    info.layers.begin = kind == stage_kind::only || kind == stage_kind::first ? 0 : 2;
    info.layers.end   = kind == stage_kind::first ? 2 : kind == stage_kind::middle ? 3 : 4;
    info.n_embd       = n_embd;
    info.n_vocab      = 32;
    info.boundary_row = n_embd;
    info.n_ctx        = 64;
    info.n_slots      = 2;
    info.can_discard  = true;
    stage.route_id       = "route";
    stage.epoch          = 3;
    stage.has_next_stage = kind == stage_kind::first || kind == stage_kind::middle;
    return stage;
}

// Three positions from n_past 0, as the stage takes them: token ids on a first stage, a
// boundary elsewhere (its bytes are not checked here: they are checked as they decode).
pb::ForwardRequest step_for(const stage_facts & stage) {
    pb::ForwardRequest request;
    request.mutable_key()->set_route_id("route");
    request.mutable_key()->set_epoch(3);
    request.mutable_key()->set_session_id("s");
    for (int32_t p = 0; p < 3; ++p) request.add_positions(p);
    if (stage.info.is_first()) {
        for (int32_t t : {1, 2, 3}) request.add_tokens(t);
    } else {
        pb::Boundary * boundary = request.mutable_boundary();
        boundary->set_schema(pb::BOUNDARY_SCHEMA_DENSE_RESIDUAL);
        boundary->set_dtype(pb::BOUNDARY_DTYPE_F32);
        boundary->add_shape(3);
        boundary->add_shape(n_embd);
        boundary->set_data(std::string(3 * n_embd * sizeof(float), '\0'));
    }
    return request;
}

// A first stage's decode loop: sampled, relayed, continued.
void decode_loop(pb::ForwardRequest & r) {
    r.set_relay(true);
    r.set_continue_tokens(4);
    r.mutable_output()->set_kind(pb::OUTPUT_KIND_SAMPLED);
}

// The last stage is asked `kind` for every row of the step.
void all_rows(pb::ForwardRequest & r, pb::OutputKind kind) {
    r.mutable_output()->set_kind(kind);
    for (int32_t row = 0; row < r.positions_size(); ++row) r.mutable_output()->add_rows(row);
}

using change = std::function<void(pb::ForwardRequest &, stage_facts &)>;

struct row {
    const char *                name;
    stage_kind                  kind;
    bool                        streaming;
    change                      apply;
    std::optional<error_reason> refused;     // nullopt: accepted
    const char *                says   = ""; // in the message the user sees
    const char *                detail = ""; // "key=value" of the ErrorInfo metadata
};

bool has_detail(const shard_error & error, const std::string & detail) {
    for (const auto & entry : error.metadata) {
        if (entry.first + "=" + entry.second == detail) return true;
    }
    return false;
}

const auto none = [](pb::ForwardRequest &, stage_facts &) {};

} // namespace

TEST("each check refuses what it should and nothing else") {
    using k = stage_kind;
    using e = error_reason;
    const std::vector<row> table = {
        {"a whole model's step", k::only, false, none, std::nullopt},
        {"a first stage's step", k::first, false, none, std::nullopt},
        {"a middle stage's step", k::middle, false, none, std::nullopt},
        {"a last stage's sampled step", k::last, false,
         [](auto & r, auto &) { r.mutable_output()->set_kind(pb::OUTPUT_KIND_SAMPLED); }, std::nullopt},
        {"a relayed step", k::first, false, [](auto & r, auto &) { r.set_relay(true); }, std::nullopt},
        {"a decode loop", k::first, true, [](auto & r, auto &) { decode_loop(r); }, std::nullopt},
        {"a speculative loop", k::first, true,
         [](auto & r, auto &) { decode_loop(r); r.set_loop_drafts(3); r.add_draft_context(5); }, std::nullopt},
        {"a discard at n_past", k::only, false,
         [](auto & r, auto &) {
             r.set_n_past(2); r.set_discard_from(2);
             for (int i = 0; i < 3; ++i) r.set_positions(i, 2 + i);
         }, std::nullopt},
        {"rows asked in order", k::last, false,
         [](auto & r, auto &) { r.mutable_output()->add_rows(0); r.mutable_output()->add_rows(2); }, std::nullopt},

        {"over the message limit", k::only, false, [](auto &, auto & s) { s.max_message_bytes = 8; },
         e::message_too_large,
         "bytes is over the limit", "max_message_bytes=8"},
        {"no route key", k::only, false, [](auto & r, auto &) { r.clear_key(); }, e::invalid_route_key,
         "the request carries no RouteKey"},
        {"an empty session id", k::only, false,
         [](auto & r, auto &) { r.mutable_key()->set_session_id(""); }, e::invalid_route_key,
         "session_id must hold 1..256 bytes"},
        {"a session id over 256 bytes", k::only, false,
         [](auto & r, auto &) { r.mutable_key()->set_session_id(std::string(257, 'x')); }, e::invalid_route_key,
         "session_id must hold 1..256 bytes"},
        {"another route", k::only, false, [](auto & r, auto &) { r.mutable_key()->set_route_id("other"); },
         e::route_mismatch,
         "this worker serves route 'route', not 'other'", "stage_route_id=route"},
        {"another epoch", k::only, false, [](auto & r, auto &) { r.mutable_key()->set_epoch(2); },
         e::epoch_mismatch,
         "this worker serves epoch 3, the request carries 2", "stage_epoch=3"},
        {"other layers expected", k::first, false,
         [](auto & r, auto &) { r.mutable_expected_range()->set_begin(0); r.mutable_expected_range()->set_end(3); },
         e::range_mismatch,
         "this stage owns layers 0:2, the route expects 0:3", "stage_range=0:2"},
        {"no positions", k::only, false, [](auto & r, auto &) { r.clear_positions(); r.clear_tokens(); },
         e::invalid_positions,
         "a step needs at least one position"},
        {"over the step limit", k::only, false, [](auto &, auto & s) { s.max_step_tokens = 2; }, e::step_too_large,
         "3 tokens in one step; split it", "max_step_tokens=2"},
        {"a negative n_past", k::only, false, [](auto & r, auto &) { r.set_n_past(-1); }, e::invalid_positions,
         "n_past must not be negative"},
        {"a gap in the positions", k::only, false, [](auto & r, auto &) { r.set_positions(2, 5); },
         e::invalid_positions,
         "position 2 is 5, expected 2"},
        {"a discard away from n_past", k::only, false, [](auto & r, auto &) { r.set_discard_from(1); },
         e::invalid_positions,
         "discard_from 1 must equal n_past 0"},
        {"a discard the memory cannot do", k::only, false,
         [](auto & r, auto & s) { r.set_discard_from(0); s.info.can_discard = false; }, e::discard_unsupported,
         "the memory of this stage (fake) cannot drop"},
        {"past the context", k::only, false,
         [](auto & r, auto &) { r.set_n_past(62); for (int i = 0; i < 3; ++i) r.set_positions(i, 62 + i); },
         e::context_overflow,
         "positions up to 65 exceed the context of 64", "n_ctx=64"},
        {"fewer tokens than positions", k::only, false, [](auto & r, auto &) { r.mutable_tokens()->RemoveLast(); },
         e::invalid_tokens,
         "2 token ids for 3 positions"},
        {"a token outside the vocabulary", k::only, false, [](auto & r, auto &) { r.set_tokens(1, 32); },
         e::invalid_tokens,
         "token id 32 is outside the vocabulary [0, 32)"},
        {"a negative token", k::only, false, [](auto & r, auto &) { r.set_tokens(0, -1); }, e::invalid_tokens,
         "token id -1 is outside the vocabulary"},
        {"tokens a middle stage does not take, miscounted", k::middle, false,
         [](auto & r, auto &) { r.add_tokens(1); }, e::invalid_tokens,
         "1 token ids for 3 positions"},
        {"a boundary to the first stage", k::first, false,
         [](auto & r, auto &) { r.mutable_boundary()->add_shape(3); }, e::invalid_boundary,
         "the first stage takes token ids, not a boundary"},
        {"no boundary to a middle stage", k::middle, false, [](auto & r, auto &) { r.clear_boundary(); },
         e::invalid_boundary,
         "this stage needs the previous stage's boundary"},
        {"another boundary schema", k::middle, false,
         [](auto & r, auto &) { r.mutable_boundary()->set_schema(pb::BOUNDARY_SCHEMA_MHC_RESIDUAL); },
         e::boundary_schema_mismatch,
         "boundary schema BOUNDARY_SCHEMA_MHC_RESIDUAL, this stage takes BOUNDARY_SCHEMA_DENSE_RESIDUAL"},
        {"another boundary dtype", k::middle, false,
         [](auto & r, auto &) { r.mutable_boundary()->set_dtype(pb::BOUNDARY_DTYPE_F16); },
         e::boundary_schema_mismatch,
         "boundary dtype BOUNDARY_DTYPE_F16, this stage takes BOUNDARY_DTYPE_F32"},
        {"a boundary of the wrong shape", k::last, false,
         [](auto & r, auto &) { r.mutable_boundary()->set_shape(1, n_embd + 1); }, e::invalid_boundary,
         "boundary shape [3,9], expected [3,8]"},
        {"a relay without --next-stage", k::first, false,
         [](auto & r, auto & s) { r.set_relay(true); s.has_next_stage = false; }, e::relay_unavailable,
         "started without --next-stage"},
        {"logits asked of a middle stage", k::middle, false,
         [](auto & r, auto &) { r.mutable_output()->set_kind(pb::OUTPUT_KIND_LOGITS); }, e::invalid_output_request,
         "OUTPUT_KIND_LOGITS asked of a non-last stage (layers 2:3 of 4)"},
        {"a boundary asked of the last stage", k::last, false,
         [](auto & r, auto &) { r.mutable_output()->set_kind(pb::OUTPUT_KIND_BOUNDARY); }, e::invalid_output_request,
         "the last stage answers logits, top-k or samples"},
        {"a row outside the step", k::only, false, [](auto & r, auto &) { r.mutable_output()->add_rows(3); },
         e::invalid_output_request,
         "row 3 is outside the step's 3 rows"},
        {"rows out of order", k::only, false,
         [](auto & r, auto &) { r.mutable_output()->add_rows(1); r.mutable_output()->add_rows(1); },
         e::invalid_output_request,
         "output rows must increase, each asked once (row 1 after 1)"},
        {"VERIFIED with rows", k::only, false,
         [](auto & r, auto &) { r.mutable_output()->set_kind(pb::OUTPUT_KIND_VERIFIED); r.mutable_output()->add_rows(0); },
         e::invalid_output_request,
         "VERIFIED checks every row against the step's tokens"},
        {"VERIFIED without tokens", k::last, false,
         [](auto & r, auto &) { r.mutable_output()->set_kind(pb::OUTPUT_KIND_VERIFIED); }, e::invalid_output_request,
         "VERIFIED checks every row against the step's tokens"},
        {"top_k of 0", k::only, false,
         [](auto & r, auto &) { r.mutable_output()->set_kind(pb::OUTPUT_KIND_TOP_K); }, e::invalid_output_request,
         "top_k must be within [1, n_vocab]"},
        {"top_k over the vocabulary", k::only, false,
         [](auto & r, auto &) { r.mutable_output()->set_kind(pb::OUTPUT_KIND_TOP_K); r.mutable_output()->set_top_k(33); },
         e::invalid_output_request,
         "top_k must be within [1, n_vocab]"},
        {"a negative temperature", k::only, false,
         [](auto & r, auto &) {
             r.mutable_output()->set_kind(pb::OUTPUT_KIND_SAMPLED);
             r.mutable_output()->mutable_sampling()->set_temperature(-1.0f);
         }, e::invalid_output_request,
         "sampling needs temperature >= 0"},
        {"top_p over 1", k::only, false,
         [](auto & r, auto &) {
             r.mutable_output()->set_kind(pb::OUTPUT_KIND_SAMPLED);
             r.mutable_output()->mutable_sampling()->set_top_p(1.5f);
         }, e::invalid_output_request,
         "sampling needs temperature >= 0"},
        {"draft_context without a loop", k::first, true, [](auto & r, auto &) { r.add_draft_context(1); },
         e::invalid_output_request,
         "draft_context and loop_windows are for a speculative loop"},
        {"loop_windows without a loop", k::first, true, [](auto & r, auto &) { r.set_loop_windows(2); },
         e::invalid_output_request,
         "draft_context and loop_windows are for a speculative loop"},
        {"loop_drafts on a unary call", k::first, false,
         [](auto & r, auto &) { decode_loop(r); r.set_loop_drafts(3); }, e::invalid_output_request,
         "loop_drafts is for a decode loop on the first stage"},
        {"loop_drafts over 7", k::first, true,
         [](auto & r, auto &) { decode_loop(r); r.set_loop_drafts(8); }, e::invalid_output_request,
         "loop_drafts is at most 7"},
        {"loop_windows over 8", k::first, true,
         [](auto & r, auto &) { decode_loop(r); r.set_loop_drafts(3); r.set_loop_windows(9); },
         e::invalid_output_request,
         "loop_windows is at most 8"},
        {"a loop the memory cannot discard", k::first, true,
         [](auto & r, auto & s) { decode_loop(r); r.set_loop_drafts(3); s.info.can_discard = false; },
         e::discard_unsupported,
         "a speculative loop needs it"},
        {"draft_context outside the vocabulary", k::first, true,
         [](auto & r, auto &) { decode_loop(r); r.set_loop_drafts(3); r.add_draft_context(40); }, e::invalid_tokens,
         "draft_context token id 40 is outside the vocabulary"},
        {"continue_tokens on a unary call", k::first, false, [](auto & r, auto &) { decode_loop(r); },
         e::invalid_output_request,
         "continue_tokens works on ForwardStream only"},
        {"continue_tokens on a middle stage", k::middle, true,
         [](auto & r, auto &) { decode_loop(r); }, e::invalid_output_request,
         "continue_tokens needs the first stage"},
        {"continue_tokens without sampling", k::first, true,
         [](auto & r, auto &) { decode_loop(r); r.mutable_output()->set_kind(pb::OUTPUT_KIND_LOGITS); },
         e::invalid_output_request,
         "continue_tokens needs OUTPUT_KIND_SAMPLED"},
        {"continue_tokens sampling a row before the last", k::only, true,
         [](auto & r, auto &) { decode_loop(r); r.mutable_output()->add_rows(1); }, e::invalid_output_request,
         "continue_tokens samples the last row only"},
        {"a decode loop on a first stage that does not relay", k::first, true,
         [](auto & r, auto &) { decode_loop(r); r.set_relay(false); }, e::invalid_output_request,
         "OUTPUT_KIND_SAMPLED asked of a non-last stage"},

        // Answers: 1024 bytes of envelope, a row of logits 24 + 4 x 32 bytes, of top-10
        // 24 + 9 x 10, a sampled row 24, a token's boundary 8 x 4.
        {"logits of every row, over the limit", k::last, false,
         [](auto & r, auto & s) { all_rows(r, pb::OUTPUT_KIND_LOGITS); s.max_message_bytes = 1024 + 2 * 152; },
         e::response_too_large,
         "the answer's 3 rows of logits would take 1480 bytes, over the message limit of 1328; ask for at most 2 "
         "rows of logits in one step", "max_rows=2"},
        {"logits of the rows that fit", k::last, false,
         [](auto & r, auto & s) {
             r.mutable_output()->set_kind(pb::OUTPUT_KIND_LOGITS);
             r.mutable_output()->add_rows(0);
             r.mutable_output()->add_rows(2);
             s.max_message_bytes = 1024 + 2 * 152;
         }, std::nullopt},
        {"the last row's logits, by default", k::last, false,
         [](auto &, auto & s) { s.max_message_bytes = 1024 + 152; }, std::nullopt},
        {"not even one row of logits fits", k::only, false,
         [](auto &, auto & s) { s.max_message_bytes = 1024 + 151; }, e::response_too_large,
         "ask for at most 0 rows of logits in one step (or top-k, or sampled tokens)", "max_rows=0"},
        {"top-k of every row, over the limit", k::last, false,
         [](auto & r, auto & s) {
             all_rows(r, pb::OUTPUT_KIND_TOP_K);
             r.mutable_output()->set_top_k(10);
             s.max_message_bytes = 1024 + 2 * 114;
         }, e::response_too_large,
         "the answer's 3 rows of top-10 would take 1366 bytes", "max_rows=2"},
        {"verified rows, over the limit", k::only, false,
         [](auto & r, auto & s) { r.mutable_output()->set_kind(pb::OUTPUT_KIND_VERIFIED); s.max_message_bytes = 1024 + 2 * 24; },
         e::response_too_large,
         "the answer's 3 sampled rows would take 1096 bytes", "max_rows=2"},
        {"a boundary over the limit", k::first, false, [](auto &, auto & s) { s.max_message_bytes = 1024 + 2 * 32; },
         e::response_too_large,
         "the boundary of 3 tokens would take 1120 bytes, over the message limit of 1088; send at most 2 tokens in "
         "one step", "max_tokens=2"},
        {"a relayed boundary over the limit", k::middle, false,
         [](auto & r, auto & s) { r.set_relay(true); s.max_message_bytes = 1024 + 2 * 32; }, e::response_too_large,
         "the boundary of 3 tokens", "max_tokens=2"},
        {"a boundary that fits", k::first, false, [](auto &, auto & s) { s.max_message_bytes = 1024 + 3 * 32; },
         std::nullopt},
    };
    for (const row & r : table) {
        stage_facts        stage   = stage_of(r.kind);
        pb::ForwardRequest request = step_for(stage);
        r.apply(request, stage);
        const auto error = check_step(request, stage, r.streaming);
        const bool as_expected = error ? r.refused && error->reason == *r.refused &&
                                             error->message.find(r.says) != std::string::npos &&
                                             (!*r.detail || has_detail(*error, r.detail))
                                       : !r.refused;
        if (!as_expected) {
            std::printf("  %s: %s (%s), expected %s (%s %s)\n", r.name,
                        error ? error_reason_name(error->reason) : "accepted", error ? error->message.c_str() : "",
                        r.refused ? error_reason_name(*r.refused) : "accepted", r.says, r.detail);
        }
        CHECK(as_expected);
    }
}

TEST("the first failing check answers, in the documented order") {
    stage_facts        stage   = stage_of(stage_kind::only);
    pb::ForwardRequest request = step_for(stage);
    request.mutable_key()->set_epoch(9);                        // key ...
    request.set_positions(2, 7);                                // ... before positions ...
    request.mutable_output()->set_kind(pb::OUTPUT_KIND_TOP_K);  // ... before the output
    auto error = check_step(request, stage, false);
    CHECK(error && error->reason == error_reason::epoch_mismatch);
    request.mutable_key()->set_epoch(3);
    error = check_step(request, stage, false);
    CHECK(error && error->reason == error_reason::invalid_positions);
    request.set_positions(2, 2);
    error = check_step(request, stage, false);
    CHECK(error && error->reason == error_reason::invalid_output_request);
}

TEST("a 512-row LOGITS answer of SmolLM2 is refused at the default 64 MiB, 341 rows are not") {
    stage_facts stage = stage_of(stage_kind::last);
    stage.info.n_vocab = 49152;
    stage.info.n_ctx   = 4096;
    stage.max_step_tokens = 11000;
    pb::ForwardRequest request = step_for(stage);
    request.clear_positions();
    for (int32_t p = 0; p < 512; ++p) request.add_positions(p);
    request.mutable_boundary()->set_shape(0, 512);
    request.mutable_boundary()->set_data(std::string(512 * n_embd * sizeof(float), '\0'));
    all_rows(request, pb::OUTPUT_KIND_LOGITS);
    auto error = check_step(request, stage, false);
    CHECK(error && error->reason == error_reason::response_too_large && has_detail(*error, "max_rows=341"));
    request.mutable_output()->mutable_rows()->Truncate(341);
    CHECK(!check_step(request, stage, false));
}

TEST("a refused key says what the stage serves") {
    const stage_facts stage = stage_of(stage_kind::only);
    pb::RouteKey key;
    key.set_route_id("route");
    key.set_epoch(4);
    key.set_session_id("s");
    const auto error = check_route_key(key, stage);
    CHECK(error && error->reason == error_reason::epoch_mismatch);
    CHECK(error && error->metadata.size() == 1 && error->metadata[0].second == "3");
    key.set_epoch(3);
    CHECK(!check_route_key(key, stage));
}

TEST_MAIN()
