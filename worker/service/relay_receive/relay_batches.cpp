// relay_batches.cpp - relayed batches in, one response per batch out (in the order the
// batches finish).
#include "relay_batches.h"

#include <memory>
#include <mutex>
#include <vector>

namespace meshnet {

struct relay_batches::pending_batch {
    std::mutex        mutex;
    pb::RelayResponse response;
    int               remaining = 0;
};

relay_batches::relay_batches(stage_core & core, bool local, std::function<void(pb::RelayResponse &&)> answer)
    : core_(core), local_(local), answer_(std::move(answer)) {}

void relay_batches::take(const pb::RelayRequest & request) {
    core_.metrics().count_relay_batch(local_);
    auto batch = std::make_shared<pending_batch>();
    batch->response.set_batch_id(request.batch_id());
    const int n_steps = request.steps_size();
    if (n_steps == 0) { // nothing to run: answered at once
        answer_(std::move(batch->response));
        return;
    }
    for (int i = 0; i < n_steps; ++i) {
        batch->response.add_results(); // every slot exists before any step can answer
    }
    batch->remaining = n_steps;
    std::vector<step_call> calls(static_cast<size_t>(n_steps));
    for (int i = 0; i < n_steps; ++i) {
        step_call & call = calls[static_cast<size_t>(i)];
        call.cancelled = [this] { return cancelled_.load(); };
        call.response  = batch->response.mutable_results(i)->mutable_forward();
        call.then      = [this, batch, i](const grpc::Status & status) { answered(*batch, i, status); };
    }
    const auto refused = core_.submit_batch(request.steps(), std::move(calls));
    for (int i = 0; i < n_steps; ++i) {
        if (const auto & error = refused[static_cast<size_t>(i)]) {
            answered(*batch, i, error_status(*error));
        }
    }
}

// Step `i` of `batch` has its result; the batch goes out with its last one.
void relay_batches::answered(pending_batch & batch, int i, const grpc::Status & status) {
    core_.metrics().count_answer("Relay", status);
    {
        std::lock_guard<std::mutex> lock(batch.mutex);
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
    }
    answer_(std::move(batch.response));
}

} // namespace meshnet
