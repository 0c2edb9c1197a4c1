"""Every bad input is answered with its documented reason while the worker keeps serving
other sessions (a bystander session advances after every case)."""

from __future__ import annotations

import math
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import pytest

from meshnet.local.process import WorkerProcess, route_key_of
from meshnet.route import (
    PromptTooLong,
    RouteDriver,
    RouteRefused,
    StageClient,
    StageError,
)
from meshnet.route.proto import pb
from meshnet.route.stage import stage_error

ROUTE_ID, EPOCH = "test/bad-input", 7


@dataclass
class Route:
    first: StageClient
    last: StageClient
    info_first: pb.GetInfoResponse
    info_last: pb.GetInfoResponse
    bystander: str = field(default_factory=lambda: uuid.uuid4().hex)
    bystander_n_past: int = 0

    def key(self, session: str, epoch: int = EPOCH, route_id: str = ROUTE_ID) -> pb.RouteKey:
        return pb.RouteKey(route_id=route_id, epoch=epoch, session_id=session)

    def tokens_request(self, session: str, n_past: int, tokens: list[int]) -> pb.ForwardRequest:
        return pb.ForwardRequest(key=self.key(session), n_past=n_past,
                                 positions=list(range(n_past, n_past + len(tokens))), tokens=tokens)

    def boundary_for(self, tokens: list[int]) -> pb.Boundary:
        """A real boundary: the first stage's output for `tokens` in a throwaway session."""
        session = uuid.uuid4().hex
        response = self.first.forward(self.tokens_request(session, 0, tokens))
        self.first.release(self.key(session))
        return response.boundary

    def boundary_request(self, session: str, n_past: int, boundary: pb.Boundary,
                         rows: int | None = None) -> pb.ForwardRequest:
        n = boundary.shape[0] if rows is None else rows
        request = pb.ForwardRequest(key=self.key(session), n_past=n_past,
                                    positions=list(range(n_past, n_past + n)))
        request.boundary.CopyFrom(boundary)
        return request

    def advance_bystander(self) -> None:
        """One more token of the bystander session through both stages."""
        request = self.tokens_request(self.bystander, self.bystander_n_past, [42])
        mid = self.first.forward(request)
        out_request = self.boundary_request(self.bystander, self.bystander_n_past, mid.boundary)
        out_request.output.kind = pb.OUTPUT_KIND_SAMPLED
        out = self.last.forward(out_request)
        self.bystander_n_past += 1
        assert mid.n_past == out.n_past == self.bystander_n_past
        assert len(out.sampled_tokens) == 1


@pytest.fixture(scope="module")
def route(two_stages: list[WorkerProcess]) -> Iterator[Route]:
    first, last = (StageClient(worker.endpoint) for worker in two_stages)
    built = Route(first, last, first.info(), last.info())
    built.advance_bystander()
    yield built
    first.close()
    last.close()


def refused(call: object, *args: object) -> StageError:
    with pytest.raises(StageError) as caught:
        call(*args)  # type: ignore[operator]
    return caught.value


@pytest.fixture(autouse=True)
def other_sessions_keep_being_served(route: Route) -> Iterator[None]:
    yield
    route.advance_bystander()


def test_a_wrong_epoch_is_refused_with_epoch_mismatch(route: Route) -> None:
    request = route.tokens_request("s", 0, [1, 2])
    request.key.epoch = EPOCH + 1
    error = refused(route.first.forward, request)
    assert (error.code, error.reason) == ("FAILED_PRECONDITION", "EPOCH_MISMATCH")
    assert error.metadata["stage_epoch"] == str(EPOCH)


def test_another_route_id_is_refused_with_route_mismatch(route: Route) -> None:
    request = route.tokens_request("s", 0, [1])
    request.key.route_id = "test/other"
    assert refused(route.first.forward, request).reason == "ROUTE_MISMATCH"


def test_an_unknown_session_with_n_past_is_a_cache_miss(route: Route) -> None:
    error = refused(route.first.forward, route.tokens_request(uuid.uuid4().hex, 5, [1]))
    assert (error.code, error.reason) == ("FAILED_PRECONDITION", "CACHE_MISS")
    assert error.metadata["stage_n_past"] == "0"


def test_an_n_past_that_does_not_match_the_stage_is_a_cache_miss(route: Route) -> None:
    session = uuid.uuid4().hex
    route.first.forward(route.tokens_request(session, 0, [1, 2, 3]))
    error = refused(route.first.forward, route.tokens_request(session, 5, [4]))
    assert error.reason == "CACHE_MISS"
    assert error.metadata["stage_n_past"] == "3"
    assert route.first.forward(route.tokens_request(session, 3, [4])).n_past == 4
    route.first.release(route.key(session))


@pytest.mark.parametrize("defect", ["shape", "byte length", "dtype", "schema"])
def test_a_malformed_boundary_is_refused(route: Route, defect: str) -> None:
    boundary = route.boundary_for([1, 2])
    expected = "INVALID_BOUNDARY"
    if defect == "shape":
        boundary.shape[1] += 1
    elif defect == "byte length":
        boundary.data = boundary.data[:-1]
    elif defect == "dtype":
        boundary.dtype = pb.BOUNDARY_DTYPE_BF16
        expected = "BOUNDARY_SCHEMA_MISMATCH"
    else:
        boundary.schema = pb.BOUNDARY_SCHEMA_MHC_RESIDUAL
        expected = "BOUNDARY_SCHEMA_MISMATCH"
    session = uuid.uuid4().hex
    error = refused(route.last.forward, route.boundary_request(session, 0, boundary, rows=2))
    assert (error.code, error.reason) == ("INVALID_ARGUMENT", expected)
    # Nothing was kept: the session can start from position 0.
    good = route.boundary_request(session, 0, route.boundary_for([1, 2]))
    assert route.last.forward(good).n_past == 2
    route.last.release(route.key(session))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_boundary_holding_nan_or_inf_is_refused(route: Route, value: float) -> None:
    boundary = route.boundary_for([1, 2])
    data = bytearray(boundary.data)
    data[8:12] = struct.pack("<f", value)
    boundary.data = bytes(data)
    error = refused(route.last.forward, route.boundary_request(uuid.uuid4().hex, 0, boundary))
    assert error.reason == "INVALID_BOUNDARY"
    assert "not finite" in error.detail


def test_positions_that_do_not_increase_are_refused(route: Route) -> None:
    request = route.tokens_request(uuid.uuid4().hex, 0, [1, 2, 3])
    request.positions[:] = [0, 2, 1]
    assert refused(route.first.forward, request).reason == "INVALID_POSITIONS"


def test_token_ids_outside_the_vocabulary_are_refused(route: Route) -> None:
    n_vocab = route.info_first.n_vocab
    for bad in (n_vocab, -1):
        error = refused(route.first.forward, route.tokens_request(uuid.uuid4().hex, 0, [1, bad]))
        assert (error.code, error.reason) == ("INVALID_ARGUMENT", "INVALID_TOKENS")
    assert refused(route.first.detokenize, [n_vocab + 3]).reason == "INVALID_TOKENS"


def test_a_message_over_the_size_limit_is_refused(route: Route) -> None:
    limit = route.info_last.max_message_bytes
    boundary = route.boundary_for([1])
    boundary.data = boundary.data * (limit // len(boundary.data) + 1)
    error = refused(route.last.forward, route.boundary_request(uuid.uuid4().hex, 0, boundary))
    assert (error.code, error.reason) == ("RESOURCE_EXHAUSTED", "MESSAGE_TOO_LARGE")
    assert error.metadata["max_message_bytes"] == str(limit)


def test_a_message_over_the_transport_limit_is_refused_by_grpc_itself(route: Route) -> None:
    limit = route.info_last.max_message_bytes
    boundary = route.boundary_for([1])
    boundary.data = b"\0" * (3 * limit + (2 << 20))
    error = refused(route.last.forward, route.boundary_request(uuid.uuid4().hex, 0, boundary))
    assert error.code == "RESOURCE_EXHAUSTED"  # documented: no ErrorInfo from the transport


def test_an_answer_over_the_message_limit_is_refused_before_it_is_computed(route: Route) -> None:
    # A row of SmolLM2's logits is 192 KiB: one fits the 256 KiB limit, two do not.
    session = uuid.uuid4().hex
    mid = route.first.forward(route.tokens_request(session, 0, [1, 2, 3]))
    request = route.boundary_request(session, 0, mid.boundary)
    request.output.kind = pb.OUTPUT_KIND_LOGITS
    request.output.rows[:] = [0, 1, 2]
    error = refused(route.last.forward, request)
    assert (error.code, error.reason) == ("INVALID_ARGUMENT", "RESPONSE_TOO_LARGE")
    assert error.metadata == {"max_message_bytes": str(256 << 10), "max_rows": "1"}
    assert "3 rows of logits" in error.detail and "ask for at most 1 rows" in error.detail
    # Nothing ran: the session starts at 0 on the last stage, one row at a time.
    request.output.rows[:] = [2]
    answer = route.last.forward(request)
    assert (answer.n_past, len(answer.rows)) == (3, 1)
    assert len(answer.rows[0].logits) == route.info_last.n_vocab
    route.first.release(route.key(session))
    route.last.release(route.key(session))


def test_a_step_over_the_batch_limit_is_refused(route: Route) -> None:
    n = route.info_first.max_step_tokens + 1
    error = refused(route.first.forward, route.tokens_request(uuid.uuid4().hex, 0, [1] * n))
    assert error.reason == "STEP_TOO_LARGE"


def test_a_prompt_longer_than_the_context_is_refused(route: Route) -> None:
    n_ctx, step = route.info_first.n_ctx, route.info_first.max_step_tokens
    session = uuid.uuid4().hex
    try:
        n_past = 0
        while n_past + step <= n_ctx - 4:  # fill the context up to 4 free positions
            route.first.forward(route.tokens_request(session, n_past, [1] * step))
            n_past += step
        while n_past < n_ctx - 4:
            route.first.forward(route.tokens_request(session, n_past, [1]))
            n_past += 1
        error = refused(route.first.forward, route.tokens_request(session, n_past, [1] * 5))
        assert (error.code, error.reason) == ("OUT_OF_RANGE", "CONTEXT_OVERFLOW")
        assert error.metadata["n_ctx"] == str(n_ctx)
        assert route.first.forward(route.tokens_request(session, n_past, [1] * 4)).n_past == n_ctx
    finally:
        route.first.release(route.key(session))


def test_the_driver_refuses_a_prompt_longer_than_the_context(
    two_stages: list[WorkerProcess], route: Route,
) -> None:
    with RouteDriver([w.endpoint for w in two_stages],
                     route_key=route_key_of(two_stages)) as driver:
        with pytest.raises(PromptTooLong):
            driver.generate([1] * (route.info_first.n_ctx + 1), max_tokens=1)
        # Text: counted by the stage's tokenizer, or refused from its bytes untokenized.
        n_ctx = route.info_first.n_ctx
        with pytest.raises(PromptTooLong, match=f"tokens, the route's context holds {n_ctx}"):
            driver.generate(" word" * (n_ctx + 1), max_tokens=1)
        with pytest.raises(PromptTooLong, match="more tokens than the route's context holds"):
            driver.generate("<|im_start|>" * 5000, max_tokens=1)  # 60 KB, > 162 B per token


def test_more_sessions_than_slots_are_refused_until_a_slot_is_released(route: Route) -> None:
    holder, late = uuid.uuid4().hex, uuid.uuid4().hex  # the bystander holds the other slot
    assert route.first.capacity().slots_free == 1
    route.first.forward(route.tokens_request(holder, 0, [1]))
    error = refused(route.first.forward, route.tokens_request(late, 0, [1]))
    assert (error.code, error.reason) == ("RESOURCE_EXHAUSTED", "CAPACITY_EXHAUSTED")
    assert route.first.release(route.key(holder)) is True
    assert route.first.release(route.key(holder)) is False
    assert route.first.forward(route.tokens_request(late, 0, [1])).n_past == 1
    route.first.release(route.key(late))


@pytest.mark.parametrize("kind", ["OUTPUT_KIND_LOGITS", "OUTPUT_KIND_TOP_K", "OUTPUT_KIND_SAMPLED"])
def test_logits_asked_of_a_non_last_stage_are_refused(route: Route, kind: str) -> None:
    request = route.tokens_request(uuid.uuid4().hex, 0, [1])
    request.output.kind = pb.OutputKind.Value(kind)
    request.output.top_k = 5
    error = refused(route.first.forward, request)
    assert (error.code, error.reason) == ("INVALID_ARGUMENT", "INVALID_OUTPUT_REQUEST")


def test_output_rows_asked_twice_or_out_of_order_are_refused(route: Route) -> None:
    boundary = route.boundary_for([1, 2, 3])
    # 10,000 copies of one row in a few-KB request once made the stage build 10,000
    # rows of logits (gigabytes): a step's answer holds at most its own rows.
    for rows in ([0] * 10_000, [0, 0], [2, 1]):
        request = route.boundary_request(uuid.uuid4().hex, 0, boundary)
        request.output.kind = pb.OUTPUT_KIND_LOGITS
        request.output.rows.extend(rows)
        error = refused(route.last.forward, request)
        assert (error.code, error.reason) == ("INVALID_ARGUMENT", "INVALID_OUTPUT_REQUEST")
        assert "increase" in str(error)
    session = uuid.uuid4().hex
    request = route.boundary_request(session, 0, boundary)
    request.output.kind = pb.OUTPUT_KIND_TOP_K
    request.output.top_k = 3
    request.output.rows.extend([0, 1, 2])  # every row once is fine
    answer = route.last.forward(request)
    route.last.release(route.key(session))
    assert [row.row for row in answer.rows] == [0, 1, 2]
    assert all(len(row.token_ids) == 3 for row in answer.rows)


def test_a_request_for_another_layer_range_is_refused(route: Route) -> None:
    request = route.tokens_request(uuid.uuid4().hex, 0, [1])
    request.expected_range.CopyFrom(pb.LayerRange(begin=0, end=10))
    error = refused(route.first.forward, request)
    assert (error.code, error.reason) == ("FAILED_PRECONDITION", "RANGE_MISMATCH")
    assert error.metadata["stage_range"] == "0:15"


def test_the_driver_refuses_stages_in_the_wrong_order(two_stages: list[WorkerProcess]) -> None:
    endpoints = [w.endpoint for w in reversed(two_stages)]
    with RouteDriver(endpoints) as driver, pytest.raises(RouteRefused) as caught:
        driver.connect()
    assert any("starting at layer 0" in problem for problem in caught.value.problems)


def test_the_driver_refuses_a_route_missing_a_stage(two_stages: list[WorkerProcess]) -> None:
    with RouteDriver([two_stages[0].endpoint]) as driver, pytest.raises(RouteRefused):
        driver.connect()


def test_an_unreachable_stage_is_unavailable(route: Route) -> None:
    client = StageClient("127.0.0.1:1", timeout=2.0)
    error = refused(client.info)
    assert error.code in {grpc.StatusCode.UNAVAILABLE.name, grpc.StatusCode.DEADLINE_EXCEEDED.name}
    client.close()


UNARY_METHODS = ["Forward", "GetInfo", "GetCapacity", "ReleaseSession", "Tokenize", "Detokenize"]


@pytest.mark.parametrize("method", UNARY_METHODS)
def test_bytes_that_do_not_parse_are_refused_as_malformed_with_one_log_line_per_burst(
        two_stages: list[WorkerProcess], method: str) -> None:
    worker = two_stages[0]
    with grpc.insecure_channel(worker.endpoint) as channel:
        call = channel.unary_unary(f"/meshnet.shard.v1.ShardService/{method}",
                                   request_serializer=lambda raw: raw,
                                   response_deserializer=lambda raw: raw)
        errors = []
        for _ in range(50):
            with pytest.raises(grpc.RpcError) as caught:
                call(b"\x0a\xff\xff\xff\xff\x0f", timeout=10)  # a length past the end
            errors.append(stage_error(worker.endpoint, caught.value))
    assert {(e.code, e.reason) for e in errors} == {("INVALID_ARGUMENT", "MALFORMED_REQUEST")}
    assert f"ShardService/{method}" in errors[0].detail
    logged = [line for line in worker.lines if "refused unparseable requests" in line]
    assert 1 <= len(logged) <= 10  # rate-limited: not one line per request


def test_a_flood_of_requests_protobuf_cannot_decode_logs_a_bounded_number_of_lines(
        two_stages: list[WorkerProcess]) -> None:
    # A string that is not UTF-8: protobuf itself logs a line for each such request.
    worker = two_stages[0]
    before, started = len(worker.lines), time.monotonic()
    with grpc.insecure_channel(worker.endpoint) as channel:
        call = channel.unary_unary("/meshnet.shard.v1.ShardService/Tokenize",
                                   request_serializer=lambda raw: raw,
                                   response_deserializer=lambda raw: raw)
        for _ in range(500):
            with pytest.raises(grpc.RpcError) as caught:
                call(b"\x0a\x02\xff\xfe", timeout=10)  # text: two bytes that are not UTF-8
            assert stage_error(worker.endpoint, caught.value).reason == "MALFORMED_REQUEST"
    elapsed = time.monotonic() - started
    logged = worker.lines[before:]
    # Two rate-limited topics (protobuf's and the refusals), each a line per 10 s at most.
    assert len(logged) <= 2 * (1 + int(elapsed / 10) + 1), logged
    assert not any(line.startswith("[libprotobuf") for line in logged)
