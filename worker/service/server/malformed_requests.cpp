#include "malformed_requests.h"

#include "error_info.h"
#include "rate_limited_log.h"

#include <google/protobuf/stubs/logging.h>

#include <cstdio>
#include <string>

namespace meshnet {

namespace {

using grpc::experimental::InterceptionHookPoints;

rate_limited_log & refusals() {
    static rate_limited_log log("refused unparseable requests");
    return log;
}

// One line per request a stranger sends otherwise (500 requests: 500 lines).
void protobuf_log(google::protobuf::LogLevel level, const char * file, int line, const std::string & message) {
    if (level >= google::protobuf::LOGLEVEL_FATAL) { // protobuf aborts next: say why, whatever the rate
        std::fprintf(stderr, "[libprotobuf FATAL %s:%d] %s\n", file, line, message.c_str());
        return;
    }
    static rate_limited_log log("libprotobuf");
    log.say(message.substr(0, message.find_last_not_of(" \n") + 1));
}

class malformed_request_interceptor final : public grpc::experimental::Interceptor {
  public:
    explicit malformed_request_interceptor(grpc::experimental::ServerRpcInfo * info) : info_(info) {}

    void Intercept(grpc::experimental::InterceptorBatchMethods * methods) override {
        // A unary call always carries one message: none after the receive means it did not parse.
        if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
            methods->GetRecvMessage() == nullptr) {
            malformed_ = true;
            refusals().say(std::string("the latest on ") + info_->method());
        }
        if (malformed_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
            methods->ModifySendStatus(error_status(make_error(
                error_reason::malformed_request,
                std::string("the request's bytes do not parse as the message of ") + info_->method())));
        }
        methods->Proceed();
    }

  private:
    grpc::experimental::ServerRpcInfo * info_;
    bool                                malformed_ = false;
};

class malformed_request_factory final : public grpc::experimental::ServerInterceptorFactoryInterface {
  public:
    grpc::experimental::Interceptor * CreateServerInterceptor(grpc::experimental::ServerRpcInfo * info) override {
        if (info->type() != grpc::experimental::ServerRpcInfo::Type::UNARY) {
            return nullptr;
        }
        return new malformed_request_interceptor(info);
    }
};

} // namespace

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> malformed_request_interceptors() {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> factories;
    factories.push_back(std::make_unique<malformed_request_factory>());
    return factories;
}

void rate_limit_protobuf_log() {
    google::protobuf::SetLogHandler(protobuf_log);
}

} // namespace meshnet
