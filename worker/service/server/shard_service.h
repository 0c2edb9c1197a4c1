// shard_service.h - ShardService (meshnet.shard.v1) on the gRPC callback API: each RPC
// adapts its call to the stage core (stage_core.h), which checks and runs the steps.
#pragma once

#include "stage_core.h"
#include "tokenizer_pool.h"

#include "meshnet/shard/v1/shard_service.grpc.pb.h"

#include <optional>

namespace meshnet {

class shard_service final : public pb::ShardService::CallbackService {
public:
    explicit shard_service(stage_core & core) : core_(core) {}

    grpc::ServerUnaryReactor * GetInfo(grpc::CallbackServerContext * ctx, const pb::GetInfoRequest * request,
                                       pb::GetInfoResponse * response) override;
    grpc::ServerUnaryReactor * GetCapacity(grpc::CallbackServerContext * ctx, const pb::GetCapacityRequest * request,
                                           pb::GetCapacityResponse * response) override;
    grpc::ServerUnaryReactor * Forward(grpc::CallbackServerContext * ctx, const pb::ForwardRequest * request,
                                       pb::ForwardResponse * response) override;
    grpc::ServerBidiReactor<pb::ForwardStreamRequest, pb::ForwardStreamResponse> *
        ForwardStream(grpc::CallbackServerContext * ctx) override;
    grpc::ServerBidiReactor<pb::RelayRequest, pb::RelayResponse> * Relay(grpc::CallbackServerContext * ctx) override;
    grpc::ServerWriteReactor<pb::RingResponse> * Ring(grpc::CallbackServerContext * ctx,
                                                   const pb::RingRequest * request) override;
    grpc::ServerUnaryReactor * ReleaseSession(grpc::CallbackServerContext * ctx, const pb::ReleaseSessionRequest * request,
                                              pb::ReleaseSessionResponse * response) override;
    grpc::ServerUnaryReactor * Tokenize(grpc::CallbackServerContext * ctx, const pb::TokenizeRequest * request,
                                        pb::TokenizeResponse * response) override;
    grpc::ServerUnaryReactor * Detokenize(grpc::CallbackServerContext * ctx, const pb::DetokenizeRequest * request,
                                          pb::DetokenizeResponse * response) override;

private:
    void finish(grpc::ServerUnaryReactor * reactor, const char * rpc, const grpc::Status & status);
    // Refuses a caller that does not prove the route key, when this stage has one (the
    // RPCs that run, read or end a session); counted as the RPC's answer.
    std::optional<grpc::Status> refuse_stranger(const grpc::CallbackServerContext * ctx, const char * rpc);

    stage_core & core_;
    // Tokenize's threads: two tokenize at once and two more wait; a fifth is refused
    // (CAPACITY_EXHAUSTED). Last: it joins before the rest goes.
    tokenizer_pool tokenizers_{2, 2};
};

} // namespace meshnet
