// shard_service.cpp - every RPC of meshnet.shard.v1, as an adaptor of the stage core:
// what the call carries in, the core's answer or refusal out.
#include "shard_service.h"
#include "forward_stream.h"
#include "proto_convert.h"
#include "relay_stream.h"
#include "tokenize_bound.h"
#include "utf8_text.h"

#include <chrono>

namespace meshnet {

namespace {

// A stream refused at once with a status (the caller did not prove the route key, or
// Ring's own checks failed).
template <typename request, typename response>
class refused_stream final : public grpc::ServerBidiReactor<request, response> {
public:
    explicit refused_stream(const grpc::Status & status) { this->Finish(status); }
    void OnDone() override { delete this; }
};

class ring_refusal final : public grpc::ServerWriteReactor<pb::RingResponse> {
public:
    explicit ring_refusal(const grpc::Status & status) { Finish(status); }
    void OnDone() override { delete this; }
};

} // namespace

std::optional<grpc::Status> shard_service::refuse_stranger(const grpc::CallbackServerContext * ctx, const char * rpc) {
    const route_key & key = core_.identity().key;
    if (!key.present()) {
        return std::nullopt;
    }
    const auto & metadata = ctx->client_metadata();
    const auto   offered  = metadata.find(route_auth_metadata);
    std::optional<shard_error> error;
    if (offered == metadata.end()) {
        error = make_error(error_reason::route_key_missing, std::string(rpc) +
            " needs the route key: send its proof in the call's meshnet-route-auth metadata");
    } else if (!key.accepts(std::string(offered->second.data(), offered->second.size()))) {
        error = make_error(error_reason::route_key_mismatch, std::string(rpc) +
            ": the meshnet-route-auth metadata does not prove this route's key");
    }
    if (!error) {
        return std::nullopt;
    }
    const grpc::Status status = error_status(*error);
    core_.metrics().count_answer(rpc, status);
    return status;
}

void shard_service::finish(grpc::ServerUnaryReactor * reactor, const char * rpc, const grpc::Status & status) {
    core_.metrics().count_answer(rpc, status);
    reactor->Finish(status);
}

grpc::ServerUnaryReactor * shard_service::GetInfo(grpc::CallbackServerContext * ctx, const pb::GetInfoRequest *,
                                                  pb::GetInfoResponse * response) {
    const service_identity & identity = core_.identity();
    const engine_info &      info     = core_.info();
    response->set_protocol("meshnet.shard.v1");
    response->set_worker_version(identity.worker_version);
    response->set_incarnation(identity.incarnation);
    response->set_route_id(identity.route_id);
    response->set_epoch(identity.epoch);
    response->set_manifest_digest(identity.manifest_digest);
    response->set_recipe_digest(identity.recipe_digest);
    response->set_route_digest(identity.route_digest);
    response->set_architecture(info.arch);
    response->set_n_layer(info.n_layer);
    response->mutable_layers()->set_begin(info.layers.begin);
    response->mutable_layers()->set_end(info.layers.end);
    response->set_n_embd(info.n_embd);
    response->set_n_vocab(info.n_vocab);
    response->set_has_vocab(info.has_vocab);
    pb::BoundarySpec * boundary = response->mutable_boundary();
    boundary->set_schema(schema_to_pb(info.schema));
    boundary->set_dtype(dtype_to_pb(identity.boundary_dtype));
    for (int64_t dim : row_shape(info)) boundary->add_row_shape(dim);
    boundary->set_needs_token_sideband(info.needs_token_sideband);
    response->set_n_ctx(info.n_ctx);
    response->set_n_slots(info.n_slots);
    response->set_max_step_tokens(identity.max_step_tokens);
    response->set_max_message_bytes(identity.max_message_bytes);
    response->mutable_eos_token_ids()->Add(identity.eos_token_ids.begin(), identity.eos_token_ids.end());
    response->set_chat_template(identity.chat_template);
    response->set_next_stage(identity.next_stage);
    response->set_local_relay_port(static_cast<uint32_t>(identity.local_relay_port));
    response->set_requires_route_key(identity.key.present());
    response->add_boundary_encodings(pb::BOUNDARY_ENCODING_UNSPECIFIED);
    response->add_boundary_encodings(pb::BOUNDARY_ENCODING_SHUFFLE_LZ4);
    response->set_can_discard(info.can_discard);
    response->set_discard_depth(info.discard_depth);
    response->set_prefix_block(static_cast<uint32_t>(core_.prefix_block()));
    response->set_exact_step_rows(identity.exact.step_rows);
    response->set_exact_batching(identity.exact.batching);
    response->set_exactness_detail(identity.exact.detail);
    response->set_throughput_batching(identity.throughput_batching);
    response->set_exactness_probe_ms(static_cast<uint32_t>((identity.exact.probe_micros + 500) / 1000));
    response->set_ring_last(identity.ring_last);
    response->set_ring_last_incarnation(core_.ring_last_incarnation());
    if (info.drafter.kind != drafter_kind::none) {
        pb::DrafterInfo * drafter = response->mutable_drafter();
        drafter->set_kind(drafter_kind_name(info.drafter.kind));
        drafter->set_max_drafts(static_cast<uint32_t>(info.drafter.max_drafts));
        drafter->set_weight_bytes(info.drafter.weight_bytes);
        drafter->set_state_bytes(info.drafter.state_bytes);
        drafter->mutable_target_layers()->Add(info.drafter.target_layers.begin(), info.drafter.target_layers.end());
        drafter->set_n_vocab(info.drafter.n_vocab);
    }
    pb::ComputePlacement * placement = response->mutable_placement();
    placement->set_host_id(identity.placement.host_id);
    placement->mutable_cpus()->Add(identity.placement.cpus.begin(), identity.placement.cpus.end());
    placement->set_threads(identity.placement.threads);
    placement->set_gpu_layers(identity.placement.gpu_layers);
    auto * reactor = ctx->DefaultReactor();
    finish(reactor, "GetInfo", grpc::Status::OK);
    return reactor;
}

grpc::ServerUnaryReactor * shard_service::GetCapacity(grpc::CallbackServerContext * ctx, const pb::GetCapacityRequest *,
                                                      pb::GetCapacityResponse * response) {
    const auto now = core_.gauges();
    response->set_slots_total(static_cast<int32_t>(now.slots_total));
    response->set_slots_free(core_.sessions().slots_free());
    response->set_kv_tokens_total(now.kv_tokens_total);
    response->set_kv_tokens_free(now.kv_tokens_total - now.kv_tokens_used);
    response->set_queue_depth(static_cast<int32_t>(now.queue_depth));
    response->set_recent_tokens_per_second(core_.recent_tokens_per_second());
    response->set_active_sessions(static_cast<int32_t>(now.active_sessions));
    response->set_draft_tokens_verified(core_.metrics().drafts_verified());
    response->set_draft_tokens_accepted(core_.metrics().drafts_accepted());
    auto * reactor = ctx->DefaultReactor();
    finish(reactor, "GetCapacity", grpc::Status::OK);
    return reactor;
}

grpc::ServerUnaryReactor * shard_service::Forward(grpc::CallbackServerContext * ctx, const pb::ForwardRequest * request,
                                                  pb::ForwardResponse * response) {
    auto * reactor = ctx->DefaultReactor();
    if (auto refused = refuse_stranger(ctx, "Forward")) {
        reactor->Finish(*refused);
        return reactor;
    }
    step_call call;
    call.cancelled = [ctx] { return ctx->IsCancelled(); };
    call.response  = response;
    call.then      = [this, reactor](const grpc::Status & status) { finish(reactor, "Forward", status); };
    if (auto error = core_.submit(*request, std::move(call))) {
        finish(reactor, "Forward", error_status(*error));
    }
    return reactor;
}


grpc::ServerBidiReactor<pb::ForwardStreamRequest, pb::ForwardStreamResponse> *
shard_service::ForwardStream(grpc::CallbackServerContext * ctx) {
    if (auto refused = refuse_stranger(ctx, "ForwardStream")) {
        return new refused_stream<pb::ForwardStreamRequest, pb::ForwardStreamResponse>(*refused);
    }
    return forward_stream_open(core_);
}

grpc::ServerBidiReactor<pb::RelayRequest, pb::RelayResponse> * shard_service::Relay(grpc::CallbackServerContext * ctx) {
    if (auto refused = refuse_stranger(ctx, "Relay")) {
        return new refused_stream<pb::RelayRequest, pb::RelayResponse>(*refused);
    }
    return relay_stream_open(core_);
}

grpc::ServerWriteReactor<pb::RingResponse> * shard_service::Ring(grpc::CallbackServerContext * ctx,
                                                              const pb::RingRequest * request) {
    if (auto refused = refuse_stranger(ctx, "Ring")) {
        return new ring_refusal(*refused);
    }
    pb::RouteKey key = request->key();
    key.set_session_id("ring"); // the subscription names no session; check_key wants one
    std::optional<shard_error> error = core_.check_key(key);
    if (!error && !core_.identity().key.present()) {
        error = make_error(error_reason::ring_unavailable,
            "this stage was started without --route-key-file: it offers no Ring (its tokens would go to anyone)");
    }
    if (!error && !core_.info().is_last()) {
        error = make_error(error_reason::ring_unavailable,
            "this stage (layers " + core_.info().layers.str() + " of " + std::to_string(core_.info().n_layer) +
            ") is not the route's last stage; subscribe at the last stage");
    }
    if (error) {
        core_.metrics().count_answer("Ring", error_status(*error));
        return new ring_refusal(error_status(*error));
    }
    if (auto * subscribed = core_.subscribe_ring(request->key())) {
        return subscribed;
    }
    const grpc::Status full = error_status(make_error(error_reason::capacity_exhausted,
        "this last stage already has " + std::to_string(core_.identity().ring_subscribers) +
        " Ring subscribers (--ring-subscribers)",
        {{"max_ring_subscribers", std::to_string(core_.identity().ring_subscribers)}}));
    core_.metrics().count_answer("Ring", full);
    return new ring_refusal(full);
}

grpc::ServerUnaryReactor * shard_service::ReleaseSession(grpc::CallbackServerContext * ctx,
                                                         const pb::ReleaseSessionRequest * request,
                                                         pb::ReleaseSessionResponse * response) {
    auto * reactor = ctx->DefaultReactor();
    if (auto refused = refuse_stranger(ctx, "ReleaseSession")) {
        reactor->Finish(*refused);
        return reactor;
    }
    if (auto error = core_.check_key(request->key())) {
        finish(reactor, "ReleaseSession", error_status(*error));
        return reactor;
    }
    // down the chain too: a chain's client need only call its first stage
    core_.release(key_of(request->key()), [this, reactor, response](bool released) {
        response->set_released(released);
        finish(reactor, "ReleaseSession", grpc::Status::OK);
    });
    return reactor;
}

grpc::ServerUnaryReactor * shard_service::Tokenize(grpc::CallbackServerContext * ctx, const pb::TokenizeRequest * request,
                                                   pb::TokenizeResponse * response) {
    auto * reactor = ctx->DefaultReactor();
    if (!core_.info().has_vocab) {
        finish(reactor, "Tokenize", error_status(make_error(error_reason::no_vocabulary, "this stage has no vocabulary")));
        return reactor;
    }
    if (static_cast<int64_t>(request->ByteSizeLong()) > core_.identity().max_message_bytes) {
        finish(reactor, "Tokenize", error_status(make_error(error_reason::message_too_large, "text over the limit",
            {{"max_message_bytes", std::to_string(core_.identity().max_message_bytes)}})));
        return reactor;
    }
    std::vector<text_range> literal;
    for (const pb::TextRange & range : request->literal()) {
        literal.push_back({range.begin(), range.end()});
    }
    if (!literal_ranges_valid(literal, request->text().size())) {
        finish(reactor, "Tokenize", error_status(make_error(error_reason::invalid_text_ranges,
            "literal ranges must be sorted, non-empty, non-overlapping and within the text's " +
            std::to_string(request->text().size()) + " bytes")));
        return reactor;
    }
    // Text that cannot fit is refused from its bytes: tokenizing it whole costs more than
    // linear time in its special tokens.
    const int64_t n_ctx    = core_.n_ctx();
    const int64_t at_least = min_tokens(request->text(), core_.identity().tokenize);
    if (at_least > n_ctx) {
        finish(reactor, "Tokenize", error_status(make_error(error_reason::context_overflow,
            "the text (" + std::to_string(request->text().size()) + " bytes) is at least " + std::to_string(at_least) +
            " tokens, the context holds " + std::to_string(n_ctx), {{"n_ctx", std::to_string(n_ctx)}})));
        return reactor;
    }
    const bool taken = tokenizers_.try_run([this, ctx, reactor, request, response, n_ctx, literal] {
        if (ctx->IsCancelled()) {
            finish(reactor, "Tokenize", grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled"));
            return;
        }
        std::vector<int32_t> tokens;
        const engine_status status = core_.engine().tokenize(request->text(), request->add_special(), literal, tokens);
        if (status != engine_status::ok) {
            finish(reactor, "Tokenize", error_status(make_error(error_reason::engine_failure,
                std::string("tokenize: ") + engine_status_name(status))));
            return;
        }
        if (static_cast<int64_t>(tokens.size()) > n_ctx) {
            finish(reactor, "Tokenize", error_status(make_error(error_reason::context_overflow,
                "the text is " + std::to_string(tokens.size()) + " tokens, the context holds " + std::to_string(n_ctx),
                {{"n_ctx", std::to_string(n_ctx)}, {"n_tokens", std::to_string(tokens.size())}})));
            return;
        }
        response->mutable_tokens()->Add(tokens.begin(), tokens.end());
        finish(reactor, "Tokenize", grpc::Status::OK);
    });
    if (!taken) {
        finish(reactor, "Tokenize", error_status(make_error(error_reason::capacity_exhausted,
            "every tokenizer of this stage is busy; retry shortly")));
    }
    return reactor;
}

grpc::ServerUnaryReactor * shard_service::Detokenize(grpc::CallbackServerContext * ctx,
                                                     const pb::DetokenizeRequest * request,
                                                     pb::DetokenizeResponse * response) {
    auto * reactor = ctx->DefaultReactor();
    if (!core_.info().has_vocab) {
        finish(reactor, "Detokenize", error_status(make_error(error_reason::no_vocabulary, "this stage has no vocabulary")));
        return reactor;
    }
    for (int32_t token : request->tokens()) {
        if (token < 0 || token >= core_.info().n_vocab) {
            finish(reactor, "Detokenize", error_status(make_error(error_reason::invalid_tokens,
                "token id " + std::to_string(token) + " is outside the vocabulary")));
            return reactor;
        }
    }
    const std::vector<int32_t> tokens(request->tokens().begin(), request->tokens().end());
    std::string text;
    const engine_status status = core_.engine().detokenize(tokens, text);
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
