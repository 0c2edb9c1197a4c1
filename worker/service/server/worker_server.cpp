// worker_server.cpp - server wiring. Binds where told (127.0.0.1 by default) and warns
// loudly when a non-loopback address is served without TLS.
#include "worker_server.h"
#include "malformed_requests.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#ifndef MESHNET_WORKER_VERSION
#define MESHNET_WORKER_VERSION "0.1.0"
#endif

namespace meshnet {

std::string new_incarnation() {
    std::random_device device;
    std::ostringstream out;
    for (int i = 0; i < 4; ++i) {
        char part[9];
        std::snprintf(part, sizeof(part), "%08x", device());
        out << part;
    }
    return out.str();
}

static bool read_file(const std::string & path, std::string & out, std::string & error) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        error = "cannot read " + path;
        return false;
    }
    std::ostringstream buffer;
    buffer << in.rdbuf();
    out = buffer.str();
    return true;
}

static bool is_loopback(const std::string & address) {
    return address.rfind("127.", 0) == 0 || address.rfind("localhost:", 0) == 0 || address.rfind("[::1]:", 0) == 0 ||
           address.rfind("unix:", 0) == 0;
}

// What this stage packs the boundaries it relays in (--boundary-compression): never for a next
// stage on loopback, where packing costs CPU and saves nothing. The one way around that is for
// tests (MESHNET_TEST_COMPRESS_LOOPBACK=1), honoured only by a worker that itself listens on
// loopback, so a served stage (listening on its pod's or host's address) never takes it.
static boundary_encoding next_stage_encoding(const worker_params & params) {
    if (params.boundary_compression == boundary_encoding::raw || params.next_stage.empty()) {
        return boundary_encoding::raw;
    }
    if (!is_loopback(params.next_stage)) {
        return params.boundary_compression;
    }
    const char * test_switch = std::getenv("MESHNET_TEST_COMPRESS_LOOPBACK");
    if (test_switch != nullptr && std::string(test_switch) == "1" && is_loopback(params.listen)) {
        std::fprintf(stderr, "meshnet-shard-worker: MESHNET_TEST_COMPRESS_LOOPBACK=1: packing relayed boundaries "
                             "as %s on loopback (a test switch)\n", boundary_encoding_name(params.boundary_compression));
        return params.boundary_compression;
    }
    std::fprintf(stderr, "meshnet-shard-worker: --boundary-compression %s is off: the next stage %s is on loopback\n",
                 boundary_encoding_name(params.boundary_compression), params.next_stage.c_str());
    return boundary_encoding::raw;
}

// Stages in the route as given, or as many as stages of this one's size would make.
static int32_t pipeline_depth(const worker_params & params, const engine_info & info) {
    if (params.pipeline_depth > 0) {
        return params.pipeline_depth;
    }
    const int32_t owned = std::max<int32_t>(1, info.layers.n_layers());
    return std::max<int32_t>(1, (info.n_layer + owned / 2) / owned);
}

// The decode rows that may share an engine step (batch_limits::exact_rows): as upstream
// batches (0: any mix) where the route asked for throughput; else up to the exact step when
// sessions' rows measured to compute as alone there, and one (each session alone) when not.
static size_t shared_step_rows(const worker_params & params, const exactness & measured) {
    if (params.throughput_batching) {
        return 0;
    }
    return measured.batching ? static_cast<size_t>(std::max(1, measured.step_rows)) : 1;
}

// The bytes of requests gRPC may hold before they are decoded, over every call: as the
// flag says, or twice the larger of the transport limit (a request gRPC takes) and a
// step of every slot (their boundaries at once, as a prefill of each sends them).
static int64_t inflight_budget(const worker_params & params, const engine_info & info, int64_t transport_limit) {
    if (params.max_inflight_bytes > 0) {
        return params.max_inflight_bytes;
    }
    const int64_t step_bytes = std::min<int64_t>(
        params.max_message_bytes,
        int64_t{params.n_batch} * info.boundary_row * static_cast<int64_t>(wire_dtype_size(params.boundary_dtype)));
    return 2 * std::max<int64_t>(transport_limit, int64_t{info.n_slots} * step_bytes);
}

// A channel to another stage of the route (the next one, or the ring's last): TLS when
// a CA to trust it by is given, presenting our certificate if we have one (the other
// stage may require it: mTLS). Null with `error` set when the files cannot be read.
static std::shared_ptr<grpc::Channel> stage_channel(const std::string & address, const worker_params & params,
                                                    std::string & error) {
    std::shared_ptr<grpc::ChannelCredentials> channel_credentials = grpc::InsecureChannelCredentials();
    const std::string & roots = params.next_stage_ca.empty() ? params.tls_client_ca : params.next_stage_ca;
    if (!roots.empty()) {
        grpc::SslCredentialsOptions ssl;
        if (!read_file(roots, ssl.pem_root_certs, error) ||
            (!params.tls_cert.empty() && (!read_file(params.tls_key, ssl.pem_private_key, error) ||
                                          !read_file(params.tls_cert, ssl.pem_cert_chain, error)))) {
            return nullptr;
        }
        channel_credentials = grpc::SslCredentials(ssl);
    }
    grpc::ChannelArguments arguments;
    arguments.SetMaxReceiveMessageSize(-1);
    arguments.SetMaxSendMessageSize(-1);
    // A restarted stage must be reachable again within a second, not after gRPC's default
    // backoff of up to two minutes.
    arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    return grpc::CreateCustomChannel(address, channel_credentials, arguments);
}

// gRPC health, for the whole server and the service: what readiness probes ask.
static void set_serving(grpc::Server & server, bool serving) {
    if (auto * health = server.GetHealthCheckService()) {
        health->SetServingStatus("", serving);
        health->SetServingStatus(pb::ShardService::service_full_name(), serving);
    }
}

worker_server::~worker_server() {
    stop(0);
}

bool worker_server::start(const worker_params & params, engine_i & engine, std::string & error,
                          gguf_vocab_facts vocab, compute_placement placement, exactness measured) {
    const engine_info & info = engine.info();
    identity_.route_id          = params.route_id;
    identity_.epoch             = params.epoch;
    identity_.manifest_digest   = params.manifest_digest;
    identity_.recipe_digest     = params.recipe_digest;
    identity_.route_digest      = params.route_digest;
    identity_.incarnation       = new_incarnation();
    identity_.worker_version    = MESHNET_WORKER_VERSION;
    identity_.boundary_dtype    = params.boundary_dtype;
    identity_.max_message_bytes = params.max_message_bytes;
    identity_.max_step_tokens   = params.n_batch;
    identity_.stream_flush      = std::chrono::milliseconds(params.stream_flush_ms);
    identity_.max_loop_drafts   = params.max_loop_drafts;
    identity_.max_loop_windows  = params.max_loop_windows;
    identity_.eos_token_ids     = std::move(vocab.eos_token_ids);
    identity_.chat_template     = std::move(vocab.chat_template);
    identity_.tokenize          = vocab.tokenize;
    identity_.next_stage        = params.next_stage;
    identity_.ring_last         = params.ring_last;
    identity_.placement         = std::move(placement);
    identity_.exact             = std::move(measured);
    identity_.throughput_batching = params.throughput_batching;
    identity_.ring_subscribers  = params.ring_subscribers;
    identity_.next_stage_encoding = next_stage_encoding(params);
    if (!params.route_key_file.empty() && !route_key::load(params.route_key_file, identity_.key, error)) {
        return false;
    }
    if (!identity_.key.present()) {
        std::fprintf(stderr, "meshnet-shard-worker: no --route-key-file: serving every caller on this port, "
                             "with no Ring and no local relay\n");
    }

    std::shared_ptr<grpc::ServerCredentials> credentials;
    if (!params.tls_cert.empty()) {
        grpc::SslServerCredentialsOptions ssl(params.tls_client_ca.empty()
            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
        grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
        if (!read_file(params.tls_key, pair.private_key, error) || !read_file(params.tls_cert, pair.cert_chain, error)) {
            return false;
        }
        ssl.pem_key_cert_pairs.push_back(pair);
        if (!params.tls_client_ca.empty() && !read_file(params.tls_client_ca, ssl.pem_root_certs, error)) {
            return false;
        }
        credentials = grpc::SslServerCredentials(ssl);
    } else {
        credentials = grpc::InsecureServerCredentials();
        if (!is_loopback(params.listen)) {
            std::fprintf(stderr,
                "\n!!! WARNING: serving %s WITHOUT TLS. Anyone who can reach it can run the model and\n"
                "!!! read boundaries. Pass --tls-cert/--tls-key (and --tls-client-ca for mTLS).\n\n",
                params.listen.c_str());
        }
    }

    std::shared_ptr<grpc::Channel> next_stage, ring_last;
    if (!params.next_stage.empty() && !(next_stage = stage_channel(params.next_stage, params, error))) {
        return false;
    }
    if (!params.ring_last.empty() && !(ring_last = stage_channel(params.ring_last, params, error))) {
        return false;
    }

    // The local relay: only with a route key (its connections open with a token derived
    // from it), without TLS, and not beside a Unix socket (whose file permissions guard the
    // service), so it opens nothing the gRPC port does not.
    const bool tls = !params.tls_cert.empty();
    const bool keyed = identity_.key.present();
    if (params.local_relay && keyed && !tls && params.listen.rfind("unix:", 0) != 0) {
        local_relay_ = std::make_unique<local_relay_server>(identity_.key.local_relay_token(identity_.incarnation));
        std::string why;
        if (local_relay_->listen(why)) {
            identity_.local_relay_port = local_relay_->port();
        } else { // gRPC carries the relay then, as with --local-relay off
            std::fprintf(stderr, "meshnet-shard-worker: no local relay (%s)\n", why.c_str());
            local_relay_.reset();
        }
    }
    const bool next_stage_local = params.local_relay && keyed && !tls && params.next_stage_ca.empty() &&
                                  is_loopback(params.next_stage) &&
                                  params.next_stage.rfind("unix:", 0) != 0;

    sessions_  = std::make_unique<session_store>(info.n_slots, std::chrono::milliseconds(params.evict_idle_ms));
    scheduler_ = std::make_unique<scheduler>(engine, *sessions_, params.n_batch,
                                             std::chrono::microseconds(params.batch_wait_us),
                                             pipeline_depth(params, info), shared_step_rows(params, measured));
    scheduler_->set_prefix_cache(params.prefix_block, params.prefix_cache_entries);
    registry_  = std::make_unique<metrics_registry>();
    core_      = std::make_unique<stage_core>(identity_, engine, *sessions_, *scheduler_, *registry_, next_stage,
                                              next_stage_local, ring_last);
    service_   = std::make_unique<shard_service>(*core_);
    scheduler_->start();

    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(params.listen, credentials, &port_);
    builder.RegisterService(service_.get());
    builder.experimental().SetInterceptorCreators(malformed_request_interceptors());
    rate_limit_protobuf_log();
    // The transport limit sits above the service's own so oversize requests get the
    // documented MESSAGE_TOO_LARGE answer; only far larger ones hit gRPC's plain one.
    const int64_t transport_limit = std::min<int64_t>(INT32_MAX, 2 * params.max_message_bytes + (1 << 20));
    builder.SetMaxReceiveMessageSize(static_cast<int>(transport_limit));
    builder.SetMaxSendMessageSize(-1);
    // Many large requests at once (refused or not) must not take the worker's memory:
    // what gRPC holds of them is held to a budget, past which it cancels calls with
    // RESOURCE_EXHAUSTED; and what they freed goes back to the system after the burst.
    inflight_quota_.Resize(static_cast<size_t>(inflight_budget(params, info, transport_limit)));
    builder.SetResourceQuota(inflight_quota_);
    heap_trimmer_ = std::make_unique<heap_trimmer>();
    // Connections that never finish their handshake, or hold no call for long, are
    // closed (a client's channel reconnects by itself), so idle ones cannot pile up.
    builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000);
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 5 * 60 * 1000);
    if (local_relay_) {
        local_relay_limits limits;
        limits.max_frame_bytes = static_cast<size_t>(transport_limit);
        limits.idle_timeout    = std::chrono::milliseconds(params.local_relay_idle_ms);
        local_relay_->start(*core_, limits);
    }
    server_ = builder.BuildAndStart();
    if (!server_ || port_ == 0) {
        error = "cannot listen on " + params.listen;
        scheduler_->stop();
        return false;
    }
    const std::chrono::milliseconds ring_bound(params.ring_ready_ms);
    if (core_->has_ring_link()) { // not ready until subscribed: a new route never starts as a chain
        set_serving(*server_, false);
        ready_ = std::thread([this, ring_bound, last = params.ring_last] { serve_when_ready(ring_bound, last); });
    } else {
        serve_when_ready(ring_bound, params.ring_last); // at once
    }

    if (!params.metrics_listen.empty()) {
        stage_core * core = core_.get();
        metrics_registry * registry = registry_.get();
        if (!metrics_.start(params.metrics_listen,
                            [core, registry] { return registry->render(core->gauges()); }, error)) {
            stop(0);
            return false;
        }
    }
    return true;
}

void worker_server::serve_when_ready(std::chrono::milliseconds bound, const std::string & ring_last) {
    std::string why;
    switch (core_->wait_ring(bound, why)) {
        case ring_link::wait_result::stopped:
            return;
        case ring_link::wait_result::timed_out:
            std::fprintf(stderr, "meshnet-shard-worker: ring: could not subscribe at the last stage %s within "
                         "%lld ms (%s): serving as a chain, a leg slower per token, until it subscribes\n",
                         ring_last.c_str(), static_cast<long long>(bound.count()), why.c_str());
            break;
        case ring_link::wait_result::subscribed:
            break;
    }
    set_serving(*server_, true);
    metrics_.set_serving(true);
    std::fprintf(stderr, "meshnet-shard-worker: serving (gRPC health SERVING)\n");
    std::fflush(stderr);
}

void worker_server::stop(int grace_ms) {
    if (core_) {
        core_->stop_ring(); // also ends serve_when_ready's wait
    }
    if (ready_.joinable()) {
        ready_.join();
    }
    metrics_.set_serving(false);
    if (server_) {
        set_serving(*server_, false);
        server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(grace_ms));
        server_->Wait();
        server_.reset();
    }
    if (scheduler_) {
        scheduler_->stop(); // answers every step still queued, so the local relay can close
    }
    if (local_relay_) {
        local_relay_->stop();
    }
    metrics_.stop();
    heap_trimmer_.reset();
}

} // namespace meshnet
