// relay_inflight.cpp - see relay_inflight.h.
#include "relay_inflight.h"

#include <algorithm>
#include <string>
#include <utility>

namespace meshnet {

std::vector<relay_answer> failed_answers(size_t n, const grpc::Status & status) {
    std::vector<relay_answer> answers(n);
    for (auto & answer : answers) {
        answer.status = status;
    }
    return answers;
}

void relay_inflight::add(uint64_t batch_id, size_t n_steps, relay_batch_done done, clock::time_point sent) {
    std::lock_guard<std::mutex> lock(mutex_);
    batches_.emplace(batch_id, batch{n_steps, std::move(done), sent});
}

bool relay_inflight::answer(pb::RelayResponse & response) {
    batch answered;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = batches_.find(response.batch_id());
        if (it == batches_.end()) {
            return false;
        }
        answered = std::move(it->second);
        batches_.erase(it);
    }
    auto & results = *response.mutable_results();
    std::vector<relay_answer> answers(answered.n_steps);
    for (size_t i = 0; i < answered.n_steps; ++i) {
        if (i >= static_cast<size_t>(results.size())) {
            answers[i].status = grpc::Status(grpc::StatusCode::INTERNAL,
                "the next stage answered " + std::to_string(results.size()) + " of " +
                std::to_string(answered.n_steps) + " relayed steps");
            continue;
        }
        pb::RelayResult & result = results[static_cast<int>(i)];
        if (result.code() == 0) {
            answers[i].response = std::move(*result.mutable_forward());
        } else {
            answers[i].status = grpc::Status(static_cast<grpc::StatusCode>(result.code()), result.message(),
                                             result.details());
        }
    }
    answered.done(answers);
    return true;
}

void relay_inflight::set_ending_status(const grpc::Status & why) {
    std::lock_guard<std::mutex> lock(mutex_);
    ending_status_ = why;
}

void relay_inflight::fail_all(const grpc::Status & fallback) {
    std::map<uint64_t, batch> failing;
    grpc::Status why;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        failing.swap(batches_);
        why = ending_status_.ok() ? fallback : ending_status_;
    }
    for (auto & entry : failing) {
        auto answers = failed_answers(entry.second.n_steps, why);
        entry.second.done(answers);
    }
}

relay_inflight::clock::time_point relay_inflight::oldest(clock::time_point now) const {
    std::lock_guard<std::mutex> lock(mutex_);
    clock::time_point first = now;
    for (const auto & entry : batches_) {
        first = std::min(first, entry.second.sent);
    }
    return first;
}

bool relay_inflight::empty() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return batches_.empty();
}

} // namespace meshnet
