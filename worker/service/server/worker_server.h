// worker_server.h - assembles a running worker: session store, scheduler, stage core, ShardService,
// health service, TLS/mTLS credentials and the /metrics server.
#pragma once

#include "engine.h"
#include "exactness_probe.h"
#include "gguf_vocab.h"
#include "heap_trim.h"
#include "metrics.h"
#include "scheduler.h"
#include "session_store.h"
#include "local_relay_server.h"
#include "shard_service.h"
#include "stage_core.h"
#include "worker_params.h"

#include <grpcpp/resource_quota.h>
#include <grpcpp/server.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

namespace meshnet {

class worker_server {
public:
    ~worker_server();

    // Serves `engine` as `params` say; false with `error` set when it cannot.
    // `vocab`: end-of-generation ids and chat template; `placement`: where the engine
    // computes (host_facts.h); both for GetInfo. `measured`: what the engine computes exactly
    // (exactness_probe.h): how sessions may share steps, and GetInfo's claim (none by default).
    bool start(const worker_params & params, engine_i & engine, std::string & error,
               gguf_vocab_facts vocab = {}, compute_placement placement = {}, exactness measured = {});
    // Stops accepting, lets in-flight calls finish (up to `grace_ms`), stops the engine thread.
    void stop(int grace_ms = 2000);

    int port() const { return port_; }
    int metrics_port() const { return metrics_.port(); }
    const std::string & incarnation() const { return identity_.incarnation; }

private:
    // Reports the service SERVING (gRPC health: the pods' readiness) once a ring's first
    // stage subscribed at the last stage, or `bound` later anyway; at once otherwise.
    void serve_when_ready(std::chrono::milliseconds bound, const std::string & ring_last);

    service_identity                  identity_;
    std::unique_ptr<session_store>    sessions_;
    std::unique_ptr<scheduler>        scheduler_;
    std::unique_ptr<metrics_registry> registry_;
    std::unique_ptr<stage_core>       core_;
    std::unique_ptr<shard_service>    service_; // the RPCs of core_
    std::unique_ptr<grpc::Server>     server_;
    std::unique_ptr<local_relay_server> local_relay_; // after the service it serves
    metrics_server                    metrics_;
    grpc::ResourceQuota               inflight_quota_{"meshnet-shard-worker requests"};
    std::unique_ptr<heap_trimmer>     heap_trimmer_;
    std::thread                       ready_; // serve_when_ready
    int                               port_ = 0;
};

std::string new_incarnation();

} // namespace meshnet
