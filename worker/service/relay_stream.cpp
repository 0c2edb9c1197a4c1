// relay_stream.cpp - Relay, server side: batches in, one response per batch out (in the
// order batches finish); cancelling the stream releases the sessions still waiting.
#include "relay_stream.h"
#include "write_queue.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>

namespace meshnet {

namespace {

class relay_stream_reactor final : public grpc::ServerBidiReactor<pb::RelayRequest, pb::RelayResponse> {
public:
    explicit relay_stream_reactor(shard_service & service) : service_(service) {
        StartRead(&request_);
    }

    void OnReadDone(bool ok) override {
        if (!ok) { // half-close or cancellation: finish once the batches in hand are answered
            std::lock_guard<std::recursive_mutex> lock(mutex_);
            reads_done_ = true;
            maybe_finish();
            return;
        }
        auto batch = std::make_shared<pending_batch>();
        batch->response.set_batch_id(request_.batch_id());
        const int n_steps = request_.steps_size();
        if (n_steps == 0) { // nothing to run: answered at once
            std::lock_guard<std::recursive_mutex> lock(mutex_);
            writes_.push(std::move(batch->response));
            write_next();
            StartRead(&request_);
            return;
        }
        for (int i = 0; i < n_steps; ++i) {
            batch->response.add_results(); // every slot exists before any step can answer
        }
        batch->remaining = n_steps;
        {
            std::lock_guard<std::recursive_mutex> lock(mutex_);
            ++unanswered_;
        }
        std::vector<step_job> jobs;
        for (int i = 0; i < n_steps; ++i) {
            step_job    job;
            output_plan plan;
            if (auto error = service_.prepare(request_.steps(i), job, plan)) {
                answered(*batch, i, error_status(*error));
                continue;
            }
            const auto arrived = std::chrono::steady_clock::now();
            job.cancelled = [this] { return cancelled_.load(); };
            job.done = [this, batch, i, plan = std::move(plan), arrived](step_outcome & outcome) mutable {
                if (!outcome.ok) {
                    answered(*batch, i, error_status(outcome.error));
                    return;
                }
                pb::ForwardResponse * response = batch->response.mutable_results(i)->mutable_forward();
                service_.complete(plan, outcome, *response, [this, batch, i, arrived, response](const grpc::Status & status) {
                    if (status.ok()) {
                        service_.record_served(*response, arrived);
                    }
                    answered(*batch, i, status);
                });
            };
            jobs.push_back(std::move(job));
        }
        if (!jobs.empty()) { // the engine first, then the next read
            service_.steps().submit_all(std::move(jobs));
        }
        StartRead(&request_); // prepare() copied what the jobs need out of request_
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
        cancelled_ = true; // steps not yet run release their sessions (scheduler)
    }

    void OnDone() override {
        delete this;
    }

private:
    struct pending_batch {
        pb::RelayResponse response;
        int               remaining = 0; // guarded by the reactor's mutex
    };

    // Step `i` of `batch` has its result; the batch goes out with its last one.
    void answered(pending_batch & batch, int i, const grpc::Status & status) {
        std::lock_guard<std::recursive_mutex> lock(mutex_);
        service_.metrics().count_request("Relay", status_code_name(status.error_code()));
        if (!status.ok()) {
            pb::RelayResult * result = batch.response.mutable_results(i);
            result->Clear();
            result->set_code(static_cast<int32_t>(status.error_code()));
            result->set_message(status.error_message());
            result->set_details(status.error_details());
        }
        if (--batch.remaining > 0) {
            return;
        }
        writes_.push(std::move(batch.response));
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

    shard_service &                service_;
    pb::RelayRequest               request_;
    write_queue<pb::RelayResponse> writes_;
    std::atomic<bool>              cancelled_{false};
    // Recursive: gRPC may run a reaction inline from StartWrite/Finish while we hold it.
    std::recursive_mutex           mutex_;
    int                            unanswered_ = 0; // batches read, not yet queued to write
    bool                           reads_done_ = false;
    bool                           finished_   = false;
};

} // namespace

grpc::ServerBidiReactor<pb::RelayRequest, pb::RelayResponse> * relay_stream_open(shard_service & service) {
    return new relay_stream_reactor(service);
}

} // namespace meshnet
