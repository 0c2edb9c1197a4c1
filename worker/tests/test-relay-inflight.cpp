// test-relay-inflight.cpp - the batches a relay stream waits on, without a stream: each
// answered by its batch_id, the rest failed together when the stream ends.
#include "relay_inflight.h"
#include "service_test.h"

#include <string>
#include <vector>

using namespace meshnet;

namespace {

// What one batch's `done` was called with, and how often.
struct seen {
    int                       calls = 0;
    std::vector<relay_answer> answers;
};

relay_batch_done record(seen & into) {
    return [&into](std::vector<relay_answer> & answers) {
        into.calls++;
        into.answers = answers;
    };
}

// The next stage's answer to batch `id`: step i answered with n_past 10 + i, or refused.
pb::RelayResponse response_for(uint64_t id, int n_results, int refused = -1) {
    pb::RelayResponse response;
    response.set_batch_id(id);
    for (int i = 0; i < n_results; ++i) {
        pb::RelayResult * result = response.add_results();
        if (i == refused) {
            result->set_code(static_cast<int32_t>(grpc::StatusCode::RESOURCE_EXHAUSTED));
            result->set_message("out of slots");
        } else {
            result->mutable_forward()->set_n_past(10 + i);
        }
    }
    return response;
}

} // namespace

TEST("an answer goes to the batch its batch_id names, step by step") {
    relay_inflight in_flight;
    seen first, second;
    in_flight.add(1, 2, record(first));
    in_flight.add(2, 3, record(second));
    pb::RelayResponse response = response_for(2, 3, /*refused =*/ 1);
    CHECK(in_flight.answer(response));
    CHECK_EQ(first.calls, 0);
    CHECK_EQ(second.calls, 1);
    CHECK_EQ(second.answers.size(), size_t{3});
    CHECK(second.answers[0].status.ok());
    CHECK_EQ(second.answers[0].response.n_past(), int64_t{10});
    CHECK(second.answers[1].status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK_EQ(second.answers[1].status.error_message(), std::string("out of slots"));
    CHECK_EQ(second.answers[2].response.n_past(), int64_t{12});
    CHECK(!in_flight.empty());
    response = response_for(1, 2);
    CHECK(in_flight.answer(response));
    CHECK_EQ(first.calls, 1);
    CHECK(in_flight.empty());
}

TEST("an answer no batch waits for is ignored") {
    relay_inflight in_flight;
    seen batch;
    in_flight.add(1, 1, record(batch));
    pb::RelayResponse stranger = response_for(7, 1);
    CHECK(!in_flight.answer(stranger));
    pb::RelayResponse response = response_for(1, 1);
    CHECK(in_flight.answer(response));
    pb::RelayResponse again = response_for(1, 1);
    CHECK(!in_flight.answer(again)); // answered already
    CHECK_EQ(batch.calls, 1);
}

TEST("a response short of steps fails the missing ones with INTERNAL") {
    relay_inflight in_flight;
    seen batch;
    in_flight.add(4, 3, record(batch));
    pb::RelayResponse response = response_for(4, 1);
    CHECK(in_flight.answer(response));
    CHECK_EQ(batch.answers.size(), size_t{3});
    CHECK(batch.answers[0].status.ok());
    for (int i : {1, 2}) {
        CHECK(batch.answers[i].status.error_code() == grpc::StatusCode::INTERNAL);
        CHECK_EQ(batch.answers[i].status.error_message(), std::string("the next stage answered 1 of 3 relayed steps"));
    }
}

TEST("the end of the stream fails every batch with why it was ended") {
    relay_inflight in_flight;
    seen a, b;
    in_flight.add(1, 2, record(a));
    in_flight.add(2, 1, record(b));
    in_flight.set_ending_status(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "too slow"));
    in_flight.fail_all(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream broke"));
    CHECK_EQ(a.calls, 1);
    CHECK_EQ(b.calls, 1);
    CHECK_EQ(a.answers.size(), size_t{2});
    for (const auto & answer : a.answers) {
        CHECK(answer.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
    }
    CHECK(b.answers[0].status.error_message() == "too slow");
    CHECK(in_flight.empty());
    in_flight.fail_all(grpc::Status(grpc::StatusCode::UNAVAILABLE, "again"));
    CHECK_EQ(a.calls, 1); // failed once only
}

TEST("a stream that broke by itself fails its batches with the fallback") {
    relay_inflight in_flight;
    seen batch;
    in_flight.add(1, 1, record(batch));
    in_flight.fail_all(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream broke"));
    CHECK(batch.answers[0].status.error_code() == grpc::StatusCode::UNAVAILABLE);
    CHECK_EQ(batch.answers[0].status.error_message(), std::string("the stream broke"));
}

TEST("oldest is when the oldest batch still waiting was sent") {
    using clock = relay_inflight::clock;
    relay_inflight in_flight;
    const clock::time_point now = clock::now();
    CHECK(in_flight.oldest(now) == now); // none waits
    seen a, b;
    in_flight.add(1, 1, record(a), now - std::chrono::seconds(5));
    in_flight.add(2, 1, record(b), now - std::chrono::seconds(2));
    CHECK(in_flight.oldest(now) == now - std::chrono::seconds(5));
    pb::RelayResponse response = response_for(1, 1);
    in_flight.answer(response);
    CHECK(in_flight.oldest(now) == now - std::chrono::seconds(2));
}

TEST_MAIN()
