// shard_service.cpp - every RPC of meshnet.shard.v1; checks happen here, before a step
// reaches the engine, so a bad request never touches a session's state.
#include "shard_service.h"
#include "draft_verify.h"
#include "forward_stream.h"
#include "loop_drafts.h"
#include "proto_convert.h"
#include "step_checks.h"
#include "relay_stream.h"
#include "utf8_text.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>

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

shard_service::shard_service(service_identity identity, engine_i & engine, session_store & sessions,
                             scheduler & steps, metrics_registry & metrics,
                             std::shared_ptr<grpc::Channel> next_stage, bool next_stage_local,
                             std::shared_ptr<grpc::Channel> ring_last)
    : identity_(std::move(identity)), engine_(engine),
      stage_(facts_of(identity_, engine.info(), next_stage != nullptr)), sessions_(sessions), steps_(steps),
      metrics_(metrics), ring_hub_(identity_.incarnation),
      next_(next_stage ? std::make_unique<relay_link>(std::move(next_stage), relay_deadline, next_stage_local)
                       : nullptr) {
    if (next_) {
        steps_.set_after_batch([this] { flush_relays(); });
    }
    if (ring_last && stage_.info.is_first() && !stage_.info.is_last()) {
        pb::RouteKey mine;
        mine.set_route_id(identity_.route_id);
        mine.set_epoch(identity_.epoch);
        ring_link_ = std::make_unique<ring_link>(std::move(ring_last), mine, [this](const pb::RingResponse & token) {
            if (token.key().route_id() != identity_.route_id || token.key().epoch() != identity_.epoch) {
                return; // never another route's or epoch's token (the last stage checks too)
            }
            std::vector<int32_t> tokens(token.tokens().begin(), token.tokens().end());
            if (tokens.empty()) {
                tokens.push_back(token.token()); // a last stage that sends `token` only
            }
            ring_waiters_.deliver(key_of(token.key()), token.position(), std::move(tokens));
        });
    }
}

shard_service::~shard_service() {
    ring_hub_.stop();
    ring_link_.reset();
}

metrics_registry::gauges shard_service::gauges() const {
    metrics_registry::gauges now;
    now.tokens_processed = steps_.tokens_processed();
    now.engine_steps     = steps_.steps_run();
    now.engine_micros    = steps_.engine_micros();
    now.active_sessions  = sessions_.active();
    now.slots_total      = sessions_.n_slots();
    now.kv_tokens_used   = steps_.kv_used();
    now.kv_tokens_total  = engine_.kv_total();
    now.queue_depth      = steps_.queue_depth();
    now.epoch            = identity_.epoch;
    return now;
}

void shard_service::finish(grpc::ServerUnaryReactor * reactor, const char * rpc, const grpc::Status & status) {
    metrics_.count_answer(rpc, status);
    reactor->Finish(status);
}

std::optional<shard_error> shard_service::check_key(const pb::RouteKey & key) const {
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
    plan.relay           = request.relay() && !plan.last;
    plan.continue_tokens = request.continue_tokens();
    plan.key             = request.key();
    plan.ring            = request.ring();
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
    return next;
}

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
    return job;
}

} // namespace

std::optional<shard_error> shard_service::decode_boundary(const pb::ForwardRequest & request,
                                                          std::vector<float> & rows) {
    if (stage_.info.is_first()) {
        return std::nullopt;
    }
    const std::string & data = request.boundary().data();
    std::string error;
    const size_t n = static_cast<size_t>(request.positions_size() * stage_.info.boundary_row);
    if (!boundary_decode(data, n, stage_.boundary_dtype, rows, error)) {
        return make_error(error_reason::invalid_boundary, error);
    }
    metrics_.add_boundary_bytes_in(static_cast<int64_t>(data.size()));
    return std::nullopt;
}

std::optional<shard_error> shard_service::prepare(const pb::ForwardRequest & request, step_job & job,
                                                  output_plan & plan, bool streaming) {
    if (auto error = check_step(request, stage_, streaming)) {
        return error;
    }
    std::vector<float> boundary;
    if (auto error = decode_boundary(request, boundary)) {
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
    return std::nullopt;
}

void shard_service::complete(output_plan & plan, step_outcome & outcome, pb::ForwardResponse & response,
                             std::function<void(const grpc::Status &)> then) {
    if (!plan.relay) {
        answer(plan, outcome, response);
        const bool sampled = plan.kind == pb::OUTPUT_KIND_SAMPLED && response.sampled_tokens_size() == 1;
        if (plan.ring && plan.last && (sampled || plan.kind == pb::OUTPUT_KIND_VERIFIED)) {
            // Straight to the first stage, before the answer starts back along the chain.
            ring_hub_.publish(plan.key, response.n_past() - plan.n_tokens,
                              {response.sampled_tokens().begin(), response.sampled_tokens().end()});
        }
        then(grpc::Status::OK);
        return;
    }
    relay_entry entry;
    entry.request  = std::move(plan.relay_request);
    entry.key      = plan.key;
    write_boundary(plan.n_tokens, outcome.boundary, *entry.request.mutable_boundary());
    write_trace(outcome.engine_micros, entry.own);
    entry.response = &response;
    entry.then     = std::move(then);
    std::lock_guard<std::mutex> lock(outbox_mutex_);
    outbox_.push_back(std::move(entry));
}

void shard_service::release(const session_key & key, std::function<void(bool)> done) {
    steps_.release(key, std::move(done));
    if (next_) {
        next_->release(route_key_of(key));
    }
}

void shard_service::flush_relays() {
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

void shard_service::write_boundary(int64_t n_tokens, const std::vector<float> & rows, pb::Boundary & out) {
    boundary_to_pb(stage_.info, identity_.boundary_dtype, n_tokens, rows, out);
    metrics_.add_boundary_bytes_out(static_cast<int64_t>(out.data().size()));
}

void shard_service::record_served(pb::ForwardResponse & response, std::chrono::steady_clock::time_point arrived) {
    const int64_t micros = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now() - arrived).count();
    response.set_server_micros(micros);
    metrics_.observe_forward_seconds(static_cast<double>(micros) * 1e-6);
}

void shard_service::write_trace(int64_t engine_micros, pb::StageTrace & out) const {
    trace_to_pb(stage_.info, identity_.incarnation, engine_micros, out);
}

void shard_service::answer(const output_plan & plan, step_outcome & outcome, pb::ForwardResponse & response) {
    response.set_n_past(outcome.n_past);
    response.set_engine_micros(outcome.engine_micros);
    write_trace(outcome.engine_micros, *response.add_chain());
    if (!plan.last) {
        write_boundary(plan.n_tokens, outcome.boundary, *response.mutable_boundary());
        return;
    }
    const int32_t n_vocab = stage_.info.n_vocab;
    if (plan.kind == pb::OUTPUT_KIND_VERIFIED) {
        const auto tokens = verify_drafts(outcome.logits.data(), n_vocab, plan.sampling, plan.row_positions,
                                          plan.step_tokens);
        response.mutable_sampled_tokens()->Add(tokens.begin(), tokens.end());
        response.set_drafted_tokens(static_cast<uint32_t>(plan.step_tokens.size() - 1));
        metrics_.count_drafts(static_cast<int64_t>(plan.step_tokens.size()) - 1,
                              static_cast<int64_t>(tokens.size()) - 1);
        return;
    }
    for (size_t i = 0; i < plan.rows.size(); ++i) {
        const float * logits = outcome.logits.data() + i * static_cast<size_t>(n_vocab);
        switch (plan.kind) {
            case pb::OUTPUT_KIND_SAMPLED:
                response.add_sampled_tokens(sample_token(logits, n_vocab, plan.sampling, plan.row_positions[i]));
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

grpc::ServerUnaryReactor * shard_service::GetInfo(grpc::CallbackServerContext * ctx, const pb::GetInfoRequest *,
                                                  pb::GetInfoResponse * response) {
    response->set_protocol("meshnet.shard.v1");
    response->set_worker_version(identity_.worker_version);
    response->set_incarnation(identity_.incarnation);
    response->set_route_id(identity_.route_id);
    response->set_epoch(identity_.epoch);
    response->set_manifest_digest(identity_.manifest_digest);
    response->set_recipe_digest(identity_.recipe_digest);
    response->set_route_digest(identity_.route_digest);
    response->set_architecture(stage_.info.arch);
    response->set_n_layer(stage_.info.n_layer);
    response->mutable_layers()->set_begin(stage_.info.layer_begin);
    response->mutable_layers()->set_end(stage_.info.layer_end);
    response->set_n_embd(stage_.info.n_embd);
    response->set_n_vocab(stage_.info.n_vocab);
    response->set_has_vocab(stage_.info.has_vocab);
    pb::BoundarySpec * boundary = response->mutable_boundary();
    boundary->set_schema(schema_to_pb(stage_.info.schema));
    boundary->set_dtype(dtype_to_pb(identity_.boundary_dtype));
    for (int64_t dim : row_shape(stage_.info)) boundary->add_row_shape(dim);
    boundary->set_needs_token_sideband(stage_.info.needs_token_sideband);
    response->set_n_ctx(stage_.info.n_ctx);
    response->set_n_slots(stage_.info.n_slots);
    response->set_max_step_tokens(identity_.max_step_tokens);
    response->set_max_message_bytes(identity_.max_message_bytes);
    response->mutable_eos_token_ids()->Add(identity_.eos_token_ids.begin(), identity_.eos_token_ids.end());
    response->set_chat_template(identity_.chat_template);
    response->set_next_stage(identity_.next_stage);
    response->set_local_relay_port(static_cast<uint32_t>(identity_.local_relay_port));
    response->set_local_relay_token(identity_.local_relay_token);
    response->set_can_discard(stage_.info.can_discard);
    response->set_ring_last(identity_.ring_last);
    response->set_ring_last_incarnation(ring_link_ ? ring_link_->incarnation() : std::string());
    pb::ComputePlacement * placement = response->mutable_placement();
    placement->set_host_id(identity_.placement.host_id);
    placement->mutable_cpus()->Add(identity_.placement.cpus.begin(), identity_.placement.cpus.end());
    placement->set_threads(identity_.placement.threads);
    placement->set_gpu_layers(identity_.placement.gpu_layers);
    auto * reactor = ctx->DefaultReactor();
    finish(reactor, "GetInfo", grpc::Status::OK);
    return reactor;
}

grpc::ServerUnaryReactor * shard_service::GetCapacity(grpc::CallbackServerContext * ctx, const pb::GetCapacityRequest *,
                                                      pb::GetCapacityResponse * response) {
    const auto now = gauges();
    response->set_slots_total(static_cast<int32_t>(now.slots_total));
    response->set_slots_free(sessions_.slots_free());
    response->set_kv_tokens_total(now.kv_tokens_total);
    response->set_kv_tokens_free(now.kv_tokens_total - now.kv_tokens_used);
    response->set_queue_depth(static_cast<int32_t>(now.queue_depth));
    response->set_recent_tokens_per_second(steps_.recent_tokens_per_second());
    response->set_active_sessions(static_cast<int32_t>(now.active_sessions));
    auto * reactor = ctx->DefaultReactor();
    finish(reactor, "GetCapacity", grpc::Status::OK);
    return reactor;
}

grpc::ServerUnaryReactor * shard_service::Forward(grpc::CallbackServerContext * ctx, const pb::ForwardRequest * request,
                                                  pb::ForwardResponse * response) {
    auto * reactor = ctx->DefaultReactor();
    const auto arrived = std::chrono::steady_clock::now();
    step_job    job;
    output_plan plan;
    if (auto error = prepare(*request, job, plan)) {
        finish(reactor, "Forward", error_status(*error));
        return reactor;
    }
    job.cancelled = [ctx] { return ctx->IsCancelled(); };
    job.done = [this, reactor, response, plan, arrived](step_outcome & outcome) mutable {
        if (!outcome.ok) {
            finish(reactor, "Forward", error_status(outcome.error));
            return;
        }
        complete(plan, outcome, *response, [this, reactor, response, arrived](const grpc::Status & status) {
            if (status.ok()) {
                record_served(*response, arrived);
            }
            finish(reactor, "Forward", status);
        });
    };
    steps_.submit(std::move(job));
    return reactor;
}


grpc::ServerBidiReactor<pb::ForwardStreamRequest, pb::ForwardStreamResponse> *
shard_service::ForwardStream(grpc::CallbackServerContext *) {
    return forward_stream_open(*this);
}

grpc::ServerBidiReactor<pb::RelayRequest, pb::RelayResponse> * shard_service::Relay(grpc::CallbackServerContext *) {
    return relay_stream_open(*this);
}

namespace {

// A Ring subscription refused at once with a typed reason.
class ring_refusal final : public grpc::ServerWriteReactor<pb::RingResponse> {
public:
    explicit ring_refusal(const grpc::Status & status) { Finish(status); }
    void OnDone() override { delete this; }
};

} // namespace

grpc::ServerWriteReactor<pb::RingResponse> * shard_service::Ring(grpc::CallbackServerContext *,
                                                              const pb::RingRequest * request) {
    pb::RouteKey key = request->key();
    key.set_session_id("ring"); // the subscription names no session; check_key wants one
    std::optional<shard_error> error = check_key(key);
    if (!error && !stage_.info.is_last()) {
        error = make_error(error_reason::ring_unavailable,
            "this stage (layers " + stage_.info.layers().str() + " of " + std::to_string(stage_.info.n_layer) +
            ") is not the route's last stage; subscribe at the last stage");
    }
    if (error) {
        metrics_.count_answer("Ring", error_status(*error));
        return new ring_refusal(error_status(*error));
    }
    return ring_hub_.subscribe(request->key());
}

grpc::ServerUnaryReactor * shard_service::ReleaseSession(grpc::CallbackServerContext * ctx,
                                                         const pb::ReleaseSessionRequest * request,
                                                         pb::ReleaseSessionResponse * response) {
    auto * reactor = ctx->DefaultReactor();
    if (auto error = check_key(request->key())) {
        finish(reactor, "ReleaseSession", error_status(*error));
        return reactor;
    }
    // down the chain too: a chain's client need only call its first stage
    release(key_of(request->key()), [this, reactor, response](bool released) {
        response->set_released(released);
        finish(reactor, "ReleaseSession", grpc::Status::OK);
    });
    return reactor;
}

grpc::ServerUnaryReactor * shard_service::Tokenize(grpc::CallbackServerContext * ctx, const pb::TokenizeRequest * request,
                                                   pb::TokenizeResponse * response) {
    auto * reactor = ctx->DefaultReactor();
    if (!stage_.info.has_vocab) {
        finish(reactor, "Tokenize", error_status(make_error(error_reason::no_vocabulary, "this stage has no vocabulary")));
        return reactor;
    }
    if (static_cast<int64_t>(request->ByteSizeLong()) > identity_.max_message_bytes) {
        finish(reactor, "Tokenize", error_status(make_error(error_reason::message_too_large, "text over the limit",
            {{"max_message_bytes", std::to_string(identity_.max_message_bytes)}})));
        return reactor;
    }
    std::vector<int32_t> tokens;
    const engine_status status = engine_.tokenize(request->text(), request->add_special(), tokens);
    if (status != engine_status::ok) {
        finish(reactor, "Tokenize", error_status(make_error(error_reason::engine_failure,
            std::string("tokenize: ") + engine_status_name(status))));
        return reactor;
    }
    response->mutable_tokens()->Add(tokens.begin(), tokens.end());
    finish(reactor, "Tokenize", grpc::Status::OK);
    return reactor;
}

grpc::ServerUnaryReactor * shard_service::Detokenize(grpc::CallbackServerContext * ctx,
                                                     const pb::DetokenizeRequest * request,
                                                     pb::DetokenizeResponse * response) {
    auto * reactor = ctx->DefaultReactor();
    if (!stage_.info.has_vocab) {
        finish(reactor, "Detokenize", error_status(make_error(error_reason::no_vocabulary, "this stage has no vocabulary")));
        return reactor;
    }
    for (int32_t token : request->tokens()) {
        if (token < 0 || token >= stage_.info.n_vocab) {
            finish(reactor, "Detokenize", error_status(make_error(error_reason::invalid_tokens,
                "token id " + std::to_string(token) + " is outside the vocabulary")));
            return reactor;
        }
    }
    const std::vector<int32_t> tokens(request->tokens().begin(), request->tokens().end());
    std::string text;
    const engine_status status = engine_.detokenize(tokens, text);
    if (status != engine_status::ok) {
        finish(reactor, "Detokenize", error_status(make_error(error_reason::engine_failure,
            std::string("detokenize: ") + engine_status_name(status))));
        return reactor;
    }
    // a proto3 string must be valid UTF-8 (clients refuse the whole answer otherwise)
    utf8_text complete = utf8_complete(text);
    response->set_text(std::move(complete.text));
    response->set_pending(std::move(complete.pending));
    finish(reactor, "Detokenize", grpc::Status::OK);
    return reactor;
}

} // namespace meshnet
