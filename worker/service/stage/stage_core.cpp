// stage_core.cpp - see stage_core.h.
#include "stage_core.h"
#include "boundary_packing.h"
#include "draft_verify.h"
#include "prefix_digest.h"
#include "proto_convert.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>

namespace meshnet {

namespace {

stage_facts facts_of(const service_identity & identity, const engine_info & info, bool has_next_stage) {
    stage_facts stage;
    stage.info              = info;
    stage.route_id          = identity.route_id;
    stage.epoch             = identity.epoch;
    stage.boundary_dtype    = identity.boundary_dtype;
    stage.max_message_bytes = identity.max_message_bytes;
    stage.max_step_tokens   = identity.max_step_tokens;
    stage.has_next_stage    = has_next_stage;
    return stage;
}

} // namespace

// A relayed step the next stage has not answered by then fails with DEADLINE_EXCEEDED:
// long enough to wait out a next stage that restarts and loads its layers.
static constexpr std::chrono::milliseconds relay_deadline{30'000};

stage_core::stage_core(service_identity identity, engine_i & engine, session_store & sessions, scheduler & steps,
                       metrics_registry & metrics, std::shared_ptr<grpc::Channel> next_stage,
                       bool next_stage_local, std::shared_ptr<grpc::Channel> ring_last)
    : identity_(std::move(identity)), engine_(engine),
      stage_(facts_of(identity_, engine.info(), next_stage != nullptr)), sessions_(sessions), steps_(steps),
      metrics_(metrics), ring_hub_(identity_.incarnation, static_cast<size_t>(identity_.ring_subscribers)),
      next_(next_stage ? std::make_unique<relay_link>(std::move(next_stage), relay_deadline, identity_.key,
                                                      next_stage_local, identity_.next_stage_encoding)
                       : nullptr) {
    if (next_) {
        steps_.set_after_batch([this] { flush_relays(); });
    }
    if (ring_last && stage_.info.is_first() && !stage_.info.is_last()) {
        pb::RouteKey mine;
        mine.set_route_id(identity_.route_id);
        mine.set_epoch(identity_.epoch);
        ring_link_ = std::make_unique<ring_link>(std::move(ring_last), mine, identity_.key.proof(),
                                                 [this](const pb::RingResponse & token) {
            if (token.key().route_id() != identity_.route_id || token.key().epoch() != identity_.epoch) {
                return; // never another route's or epoch's token (the last stage checks too)
            }
            ring_waiters_.deliver(key_of(token.key()), token.window(), ring_tokens_of(token));
        });
    }
}

stage_core::~stage_core() {
    ring_hub_.stop();
    ring_link_.reset();
}

metrics_registry::gauges stage_core::gauges() const {
    metrics_registry::gauges now;
    now.tokens_processed = steps_.tokens_processed();
    now.engine_steps     = steps_.steps_run();
    now.engine_micros    = steps_.engine_micros();
    now.superseded_steps = steps_.superseded_steps();
    now.active_sessions  = sessions_.active();
    now.slots_total      = sessions_.n_slots();
    now.kv_tokens_used   = steps_.kv_used();
    now.kv_tokens_total  = engine_.kv_total();
    now.queue_depth      = steps_.queue_depth();
    now.epoch            = identity_.epoch;
    const scheduler::prefix_counts prefix = steps_.prefix_stats();
    now.prefix_lookups       = prefix.lookups;
    now.prefix_hits          = prefix.hits;
    now.prefix_reused_tokens = prefix.reused_tokens;
    now.prefix_entries       = prefix.entries;
    now.prefix_snapshots_skipped = prefix.snapshots_skipped;
    const int64_t kv_cells   = engine_.kv_total();
    now.prefix_entry_bytes   = kv_cells > 0 ? static_cast<int64_t>(stage_.info.kv_bytes) / kv_cells * prefix.entry_tokens : 0;
    return now;
}

std::optional<shard_error> stage_core::check_key(const pb::RouteKey & key) const {
    return check_route_key(key, stage_);
}

namespace {

// How a checked step is answered: what the last stage computes from which rows, or the
// boundary a non-last stage answers or hands on.
output_plan plan_output(const pb::ForwardRequest & request, const engine_info & info) {
    const pb::OutputRequest & output = request.output();
    output_plan plan;
    plan.last            = info.is_last();
    plan.n_tokens        = request.positions_size();
    plan.n_past          = request.n_past();
    plan.relay           = request.relay() && !plan.last;
    plan.continue_tokens = request.continue_tokens();
    plan.key             = request.key();
    plan.ring            = request.ring();
    plan.window          = request.window();
    plan.want_drafts     = static_cast<int32_t>(std::min<uint32_t>(request.want_drafts(), 7));
    if (request.answer_encoding() == pb::BOUNDARY_ENCODING_SHUFFLE_LZ4) { // others: answered raw
        plan.answer_encoding = boundary_encoding::shuffle_lz4;
    }
    if (!plan.last) {
        plan.kind = pb::OUTPUT_KIND_BOUNDARY;
        return plan;
    }
    plan.kind = output.kind() == pb::OUTPUT_KIND_UNSPECIFIED ? pb::OUTPUT_KIND_LOGITS : output.kind();
    if (plan.kind == pb::OUTPUT_KIND_VERIFIED) {
        plan.step_tokens.assign(request.tokens().begin(), request.tokens().end());
        for (int32_t row = 0; row < plan.n_tokens; ++row) plan.rows.push_back(row);
    } else if (output.rows().empty()) {
        plan.rows.push_back(static_cast<int32_t>(plan.n_tokens - 1));
    } else {
        plan.rows.assign(output.rows().begin(), output.rows().end());
    }
    for (int32_t row : plan.rows) {
        plan.row_positions.push_back(request.positions(row));
    }
    if (plan.kind == pb::OUTPUT_KIND_TOP_K) {
        plan.top_k = output.top_k();
    }
    if (plan.kind == pb::OUTPUT_KIND_SAMPLED || plan.kind == pb::OUTPUT_KIND_VERIFIED) {
        const pb::SamplingParams & sampling = output.sampling();
        plan.sampling = sampling_params{sampling.temperature(), sampling.top_k(), sampling.top_p(), sampling.seed()};
    }
    return plan;
}

// The step as the next stage gets it, less the boundary this stage's step will produce.
pb::ForwardRequest relay_request_of(const pb::ForwardRequest & request, bool ring) {
    pb::ForwardRequest next;
    *next.mutable_key() = request.key();
    next.set_n_past(request.n_past());
    *next.mutable_positions() = request.positions();
    *next.mutable_tokens()    = request.tokens();
    *next.mutable_output()    = request.output();
    next.set_relay(true);
    if (request.has_discard_from()) {
        next.set_discard_from(request.discard_from());
    }
    next.set_ring(ring);
    next.set_window(request.window());
    next.set_want_drafts(request.want_drafts());
    *next.mutable_prefix_tokens() = request.prefix_tokens(); // (its prefix_chain: this stage's, once known)
    next.set_prefix_snapshot(request.prefix_snapshot());
    next.set_cache_salt(request.cache_salt());
    return next;
}

// What the engine runs for a checked step: token ids only where the stage embeds or
// reads them, output rows only on the last stage.
step_job job_of(const pb::ForwardRequest & request, const output_plan & plan, const engine_info & info) {
    step_job job;
    job.key    = key_of(request.key());
    job.n_past = request.n_past();
    job.positions.assign(request.positions().begin(), request.positions().end());
    if (info.is_first() || info.needs_token_sideband) {
        job.tokens.assign(request.tokens().begin(), request.tokens().end());
    }
    if (plan.last) {
        job.output_rows = plan.rows;
    }
    job.discard_from = request.has_discard_from() ? request.discard_from() : -1;
    job.fed_tokens.assign(request.tokens().begin(), request.tokens().end());
    job.prefix_tokens.assign(request.prefix_tokens().begin(), request.prefix_tokens().end());
    job.prefix_chain.assign(request.prefix_chain().begin(), request.prefix_chain().end());
    job.prefix_snapshot = request.prefix_snapshot();
    job.cache_salt      = request.cache_salt();
    return job;
}

} // namespace

std::optional<shard_error> stage_core::decode_boundary(const pb::ForwardRequest & request,
                                                       std::vector<float> & rows, std::string * digest) {
    if (stage_.info.is_first()) {
        return std::nullopt;
    }
    const pb::Boundary & boundary = request.boundary();
    const size_t n = static_cast<size_t>(request.positions_size() * stage_.info.boundary_row);
    const size_t value_size = wire_dtype_size(stage_.boundary_dtype);
    std::string unpacked, error;
    const std::string * data = nullptr;
    if (!boundary_unpack(boundary, value_size, n * value_size, unpacked, data, error)) {
        metrics_.count_boundary_decode_failure();
        return make_error(error_reason::invalid_boundary_encoding, error);
    }
    if (!boundary_decode(*data, n, stage_.boundary_dtype, rows, error)) {
        return make_error(error_reason::invalid_boundary, error);
    }
    const bool packed = boundary.encoding() != pb::BOUNDARY_ENCODING_UNSPECIFIED;
    metrics_.add_boundary(false, packed ? boundary_encoding::shuffle_lz4 : boundary_encoding::raw,
                          static_cast<int64_t>(data->size()), static_cast<int64_t>(boundary.data().size()));
    if (digest != nullptr) {
        *digest = sha256_digest(*data); // of the values, whatever the link packed them as
    }
    return std::nullopt;
}

std::optional<shard_error> stage_core::prepare(const pb::ForwardRequest & request, step_job & job,
                                               output_plan & plan, bool streaming) {
    if (auto error = check_step(request, stage_, streaming)) {
        return error;
    }
    std::vector<float> boundary;
    // what a block this step may add to the prefix cache was computed from
    const bool digested = !stage_.info.is_first() &&
                          grid_block(steps_.prefix_block(), request.n_past(), request.positions_size());
    std::string digest;
    if (auto error = decode_boundary(request, boundary, digested ? &digest : nullptr)) {
        return error;
    }
    plan = plan_output(request, stage_.info);
    if (plan.relay) {
        // A decode loop's steps ride the ring while it is up; others go on as they came.
        const bool ring_up = ring_link_ && !ring_link_->incarnation().empty();
        plan.relay_request = relay_request_of(request, request.ring() || (plan.continue_tokens > 0 && ring_up));
    }
    job          = job_of(request, plan, stage_.info);
    job.boundary = std::move(boundary);
    if (digested) {
        job.boundary_digest = std::move(digest);
    }
    return std::nullopt;
}

std::optional<shard_error> stage_core::accept(const pb::ForwardRequest & request, step_call call, step_job & job,
                                              bool & rides_ring) {
    auto plan = std::make_shared<output_plan>();
    if (auto error = prepare(request, job, *plan, call.streaming)) {
        return error;
    }
    rides_ring    = plan->relay && plan->relay_request.ring();
    job.cancelled = std::move(call.cancelled);
    job.done = [this, plan, arrived = std::chrono::steady_clock::now(), response = call.response,
                then = std::move(call.then)](step_outcome & outcome) {
        if (!outcome.ok) {
            then(error_status(outcome.error));
            return;
        }
        complete(*plan, outcome, *response, [this, response, arrived, then](const grpc::Status & status) {
            if (status.ok()) {
                record_served(*response, arrived);
            }
            then(status);
        });
    };
    return std::nullopt;
}

std::optional<shard_error> stage_core::submit(const pb::ForwardRequest & request, step_call call,
                                              const std::function<void(bool rides_ring)> & before_queue) {
    step_job job;
    bool     rides_ring = false;
    if (auto error = accept(request, std::move(call), job, rides_ring)) {
        return error;
    }
    if (before_queue) {
        before_queue(rides_ring);
    }
    steps_.submit(std::move(job));
    return std::nullopt;
}

std::vector<std::optional<shard_error>> stage_core::submit_batch(
    const google::protobuf::RepeatedPtrField<pb::ForwardRequest> & requests, std::vector<step_call> calls) {
    std::vector<std::optional<shard_error>> errors(static_cast<size_t>(requests.size()));
    std::vector<step_job> jobs;
    std::set<session_key> sessions; // of the steps queued so far
    for (int i = 0; i < requests.size(); ++i) {
        std::optional<shard_error> & error = errors[static_cast<size_t>(i)];
        step_job job;
        bool     rides_ring = false;
        error = accept(requests.Get(i), std::move(calls[static_cast<size_t>(i)]), job, rides_ring);
        if (error) {
            continue;
        }
        if (!sessions.insert(job.key).second) { // run, it would fail and clear the session
            error = make_error(error_reason::duplicate_session,
                "the batch carries session " + job.key.session_id + " twice; one step per session");
            continue;
        }
        jobs.push_back(std::move(job));
    }
    if (!jobs.empty()) {
        steps_.submit_all(std::move(jobs));
    }
    return errors;
}

void stage_core::complete(output_plan & plan, step_outcome & outcome, pb::ForwardResponse & response,
                          std::function<void(const grpc::Status &)> then) {
    if (!plan.relay) {
        answer(plan, outcome, response);
        const bool sampled = plan.kind == pb::OUTPUT_KIND_SAMPLED && response.sampled_tokens_size() == 1;
        if (plan.ring && plan.last && (sampled || plan.kind == pb::OUTPUT_KIND_VERIFIED)) {
            // Straight to the first stage, before the answer starts back along the chain.
            ring_hub_.publish(plan.key, response.n_past() - plan.n_tokens, plan.window,
                              {{response.sampled_tokens().begin(), response.sampled_tokens().end()},
                               {response.next_drafts().begin(), response.next_drafts().end()}});
        }
        then(grpc::Status::OK);
        return;
    }
    relay_entry entry;
    entry.request  = std::move(plan.relay_request);
    entry.key      = plan.key;
    write_boundary(plan.n_tokens, outcome.boundary, *entry.request.mutable_boundary());
    chain_sent(plan, outcome, entry.request.boundary(), *entry.request.mutable_prefix_chain());
    pack_boundary(*entry.request.mutable_boundary(), next_->encoding());
    write_trace(outcome.engine_micros, entry.own);
    entry.response = &response;
    entry.then     = std::move(then);
    std::lock_guard<std::mutex> lock(outbox_mutex_);
    outbox_.push_back(std::move(entry));
}

void stage_core::release(const session_key & key, std::function<void(bool)> done) {
    steps_.release(key, std::move(done));
    if (next_) {
        next_->release(route_key_of(key));
    }
}

void stage_core::flush_relays() {
    auto entries = std::make_shared<std::vector<relay_entry>>();
    {
        std::lock_guard<std::mutex> lock(outbox_mutex_);
        entries->swap(outbox_);
    }
    if (entries->empty()) {
        return;
    }
    std::vector<pb::ForwardRequest> steps;
    steps.reserve(entries->size());
    for (auto & entry : *entries) {
        steps.push_back(std::move(entry.request));
    }
    const auto sent = std::chrono::steady_clock::now();
    next_->send(std::move(steps), [this, entries, sent](std::vector<relay_answer> & answers) {
        const int64_t round_trip = std::chrono::duration_cast<std::chrono::microseconds>(
            std::chrono::steady_clock::now() - sent).count();
        // Decode loops feed these answers straight back in: held, their next steps are
        // all queued before the engine takes any, and run together as they came.
        auto hold = steps_.hold();
        for (size_t i = 0; i < entries->size(); ++i) {
            relay_entry & entry = (*entries)[i];
            if (answers[i].status.ok()) {
                const int64_t hop = round_trip - answers[i].response.server_micros();
                metrics_.observe_next_hop_seconds(static_cast<double>(std::max<int64_t>(hop, 0)) * 1e-6);
                *entry.response = std::move(answers[i].response);
                auto * chain = entry.response->mutable_chain();
                *chain->Add() = entry.own;
                std::rotate(chain->begin(), chain->end() - 1, chain->end()); // ours first
            }
            if (sessions_.find(key_of(entry.key)) < 0) {
                // Released here (or evicted) while the step was downstream: the release
                // sent on meanwhile may have come before the step made the session
                // there, or found the next stage restarting.
                next_->release(entry.key);
            }
            entry.then(answers[i].status);
        }
    });
}

void stage_core::write_boundary(int64_t n_tokens, const std::vector<float> & rows, pb::Boundary & out) {
    boundary_to_pb(stage_.info, identity_.boundary_dtype, n_tokens, rows, out);
}

void stage_core::pack_boundary(pb::Boundary & boundary, boundary_encoding encoding) {
    const auto raw_bytes = static_cast<int64_t>(boundary.data().size());
    boundary_pack(boundary, encoding);
    metrics_.add_boundary(true, encoding, raw_bytes, static_cast<int64_t>(boundary.data().size()));
}

void stage_core::chain_sent(const output_plan & plan, const step_outcome & outcome, const pb::Boundary & sent,
                            google::protobuf::RepeatedPtrField<std::string> & prefix_chain) {
    if (grid_block(steps_.prefix_block(), plan.n_past, plan.n_tokens)) {
        steps_.prefix_sent(outcome.slot, plan.n_past, sha256_digest(sent.data()));
    }
    prefix_chain.Add(outcome.prefix_chain.begin(), outcome.prefix_chain.end()); // a hit's: the next stage's lookup
}

void stage_core::record_served(pb::ForwardResponse & response, std::chrono::steady_clock::time_point arrived) {
    const int64_t micros = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now() - arrived).count();
    response.set_server_micros(micros);
    metrics_.observe_forward_seconds(static_cast<double>(micros) * 1e-6);
}

void stage_core::write_trace(int64_t engine_micros, pb::StageTrace & out) const {
    trace_to_pb(stage_.info, identity_.incarnation, engine_micros, out);
}

void stage_core::answer(const output_plan & plan, step_outcome & outcome, pb::ForwardResponse & response) {
    response.set_n_past(outcome.n_past);
    response.set_engine_micros(outcome.engine_micros);
    write_trace(outcome.engine_micros, *response.add_chain());
    if (!plan.last) {
        write_boundary(plan.n_tokens, outcome.boundary, *response.mutable_boundary());
        chain_sent(plan, outcome, response.boundary(), *response.mutable_prefix_chain());
        pack_boundary(*response.mutable_boundary(), plan.answer_encoding);
        return;
    }
    const int32_t n_vocab = stage_.info.n_vocab;
    if (plan.kind == pb::OUTPUT_KIND_VERIFIED) {
        const auto tokens = verify_drafts(outcome.logits.data(), n_vocab, plan.sampling, plan.row_positions,
                                          plan.step_tokens);
        response.mutable_sampled_tokens()->Add(tokens.begin(), tokens.end());
        response.set_drafted_tokens(static_cast<uint32_t>(plan.step_tokens.size() - 1));
        if (tokens.size() < plan.step_tokens.size()) {
            // a decode loop's later windows, built on the rejected rows, need not run here
            steps_.rejected_from(key_of(plan.key), plan.row_positions.back() + 1);
        }
        metrics_.count_drafts(static_cast<int64_t>(plan.step_tokens.size()) - 1,
                              static_cast<int64_t>(tokens.size()) - 1);
        draft_next(plan, plan.row_positions[tokens.size() - 1] + 1, tokens.back(), outcome, response);
        return;
    }
    for (size_t i = 0; i < plan.rows.size(); ++i) {
        const float * logits = outcome.logits.data() + i * static_cast<size_t>(n_vocab);
        switch (plan.kind) {
            case pb::OUTPUT_KIND_SAMPLED:
                response.add_sampled_tokens(sample_token(logits, n_vocab, plan.sampling, plan.row_positions[i]));
                if (i + 1 == plan.rows.size()) {
                    draft_next(plan, plan.row_positions[i] + 1, response.sampled_tokens(static_cast<int>(i)), outcome,
                               response);
                }
                break;
            case pb::OUTPUT_KIND_TOP_K: {
                pb::LogitsRow * row = response.add_rows();
                row->set_row(plan.rows[i]);
                for (const auto & entry : top_k_logits(logits, n_vocab, plan.top_k)) {
                    row->add_token_ids(entry.first);
                    row->add_logits(entry.second);
                }
                break;
            }
            default: {
                pb::LogitsRow * row = response.add_rows();
                row->set_row(plan.rows[i]);
                row->mutable_logits()->Add(logits, logits + n_vocab);
                break;
            }
        }
    }
}

void stage_core::draft_next(const output_plan & plan, int32_t pos, int32_t token, const step_outcome & outcome,
                            pb::ForwardResponse & response) {
    if (stage_.info.drafter.kind == drafter_kind::none || outcome.slot < 0 || plan.want_drafts <= 0) {
        return;
    }
    const auto started = std::chrono::steady_clock::now();
    const std::vector<int32_t> drafts = engine_.draft(outcome.slot, pos, token, plan.want_drafts);
    metrics_.observe_draft_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    response.mutable_next_drafts()->Add(drafts.begin(), drafts.end());
}

grpc::ServerWriteReactor<pb::RingResponse> * stage_core::subscribe_ring(const pb::RouteKey & key) {
    return ring_hub_.subscribe(key);
}

std::string stage_core::ring_last_incarnation() const {
    return ring_link_ ? ring_link_->incarnation() : std::string();
}

void stage_core::stop_ring() {
    ring_hub_.stop();
    if (ring_link_) {
        ring_link_->stop();
    }
}

ring_link::wait_result stage_core::wait_ring(std::chrono::milliseconds bound, std::string & why) {
    return ring_link_ ? ring_link_->wait_subscribed(bound, why) : ring_link::wait_result::subscribed;
}

} // namespace meshnet
