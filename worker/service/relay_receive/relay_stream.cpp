// relay_stream.cpp - Relay over gRPC, server side: batches in, one response per batch out
// (in the order batches finish); cancelling the stream releases the sessions still
// waiting.
#include "relay_stream.h"
#include "relay_batches.h"
#include "write_queue.h"

#include <mutex>

namespace meshnet {

namespace {

class relay_stream_reactor final : public grpc::ServerBidiReactor<pb::RelayRequest, pb::RelayResponse> {
public:
    explicit relay_stream_reactor(stage_core & core)
        : batches_(core, false, [this](pb::RelayResponse && response) { answered(std::move(response)); }) {
        StartRead(&request_);
    }

    void OnReadDone(bool ok) override {
        if (!ok) { // half-close or cancellation: finish once the batches in hand are answered
            std::lock_guard<std::recursive_mutex> lock(mutex_);
            reads_done_ = true;
            maybe_finish();
            return;
        }
        {
            std::lock_guard<std::recursive_mutex> lock(mutex_);
            ++unanswered_;
        }
        batches_.take(request_); // the engine first, then the next read
        StartRead(&request_);    // take() copied what the steps need out of request_
    }

    void OnWriteDone(bool ok) override {
        std::lock_guard<std::recursive_mutex> lock(mutex_);
        writes_.done();
        if (!ok) { // the caller is gone: what is left goes nowhere
            writes_.clear();
        }
        write_next();
        maybe_finish();
    }

    void OnCancel() override {
        batches_.cancel();
    }

    void OnDone() override {
        delete this;
    }

private:
    void answered(pb::RelayResponse && response) {
        std::lock_guard<std::recursive_mutex> lock(mutex_);
        writes_.push(std::move(response));
        --unanswered_;
        write_next();
    }

    void write_next() { // the caller holds mutex_
        if (pb::RelayResponse * next = writes_.next()) {
            StartWrite(next);
        }
    }

    void maybe_finish() { // the caller holds mutex_
        if (!finished_ && reads_done_ && unanswered_ == 0 && writes_.idle()) {
            finished_ = true;
            Finish(grpc::Status::OK);
        }
    }

    relay_batches                  batches_;
    pb::RelayRequest               request_;
    write_queue<pb::RelayResponse> writes_;
    // Recursive: gRPC may run a reaction inline from StartWrite/Finish while we hold it.
    std::recursive_mutex           mutex_;
    int                            unanswered_ = 0; // batches read, not yet queued to write
    bool                           reads_done_ = false;
    bool                           finished_   = false;
};

} // namespace

grpc::ServerBidiReactor<pb::RelayRequest, pb::RelayResponse> * relay_stream_open(stage_core & core) {
    return new relay_stream_reactor(core);
}

} // namespace meshnet
