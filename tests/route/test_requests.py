"""The requests a session sends are built from the handshake, the session's key, what it
asks of the prefix cache and what the last stage answers, with no socket: each stage gets
its range, positions and inputs, the last one the output asked for; every request of
every builder carries the tenant's salt, and a prefill's the cached prefix and snapshot
on the steps that start there; the chain's and the loop's first stage relays; a prefill
is cut into chunks that fill the pipeline at batch speed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from meshnet.route.handshake import RouteInfo
from meshnet.route.proto import pb
from meshnet.route.requests import (
    MIN_CHUNK_TOKENS,
    Answer,
    Reuse,
    chunks,
    loop_request,
    relay_request,
    sampled_output,
    stage_request,
    verified_output,
)
from meshnet.route.sampling import Sampling

MakeRoute = Callable[..., RouteInfo]
KEY = pb.RouteKey(route_id="test/route", epoch=1, session_id="s")
SAMPLED = Answer(Sampling(temperature=0.8, top_k=40, top_p=0.95, seed=7))
COLD = Reuse()  # no salt, no cached prefix, no snapshot


def sampled(n_tokens: int, answer: Answer = SAMPLED) -> pb.OutputRequest:
    return sampled_output(answer, n_tokens)


def test_the_first_stage_gets_the_tokens_at_their_positions_and_no_output(
    make_route_info: MakeRoute,
) -> None:
    route = make_route_info(3)
    request = stage_request(route, 0, KEY, [5, 6, 7], 10, sampled(3), COLD)
    assert list(request.tokens) == [5, 6, 7]
    assert list(request.positions) == [10, 11, 12]
    assert request.n_past == 10
    assert (request.expected_range.begin, request.expected_range.end) == (0, 10)
    assert request.key == KEY
    assert not request.HasField("output") and not request.HasField("boundary")


def test_a_later_stage_gets_the_boundary_and_tokens_only_when_it_needs_the_sideband(
    make_route_info: MakeRoute,
) -> None:
    route = make_route_info(3)
    previous = pb.ForwardResponse(boundary=pb.Boundary(data=b"\0" * 16))
    plain = stage_request(route, 1, KEY, [5, 6], 0, sampled(2), COLD, previous)
    assert plain.boundary.data == previous.boundary.data and not plain.tokens
    sideband = replace(route, stages=(route.stages[0],
                                      replace(route.stages[1], needs_token_sideband=True),
                                      route.stages[2]))
    assert list(stage_request(sideband, 1, KEY, [5, 6], 0, sampled(2), COLD,
                              previous).tokens) == [5, 6]


def test_the_last_stage_samples_the_last_row_with_the_sessions_sampling(
    make_route_info: MakeRoute,
) -> None:
    request = stage_request(make_route_info(3), 2, KEY, [5, 6, 7], 0, sampled(3), COLD,
                            pb.ForwardResponse())
    assert request.output.kind == pb.OUTPUT_KIND_SAMPLED
    assert list(request.output.rows) == [2]
    assert (request.output.sampling.top_k, request.output.sampling.seed) == (40, 7)
    assert abs(request.output.sampling.temperature - 0.8) < 1e-6


def test_a_prefill_chunk_before_the_last_asks_for_the_cheapest_answer(
    make_route_info: MakeRoute,
) -> None:
    request = stage_request(make_route_info(3), 2, KEY, [5, 6], 0,
                            sampled_output(SAMPLED, 2, wants_token=False), COLD,
                            pb.ForwardResponse())
    assert request.output.kind == pb.OUTPUT_KIND_SAMPLED
    assert not request.output.HasField("sampling")


def test_sampling_locally_asks_for_logits_unless_greedy(make_route_info: MakeRoute) -> None:
    route = make_route_info(1)
    local = replace(SAMPLED, sample_locally=True)
    assert stage_request(route, 0, KEY, [5], 0, sampled(1, local), COLD).output.kind == \
        pb.OUTPUT_KIND_LOGITS
    greedy = Answer(Sampling(), sample_locally=True)
    assert stage_request(route, 0, KEY, [5], 0, sampled(1, greedy), COLD).output.kind == \
        pb.OUTPUT_KIND_SAMPLED


def test_a_chain_step_goes_to_the_first_stage_which_relays_it(make_route_info: MakeRoute) -> None:
    request = relay_request(make_route_info(3, chained=True), KEY, [5, 6], 4, sampled(2), COLD)
    assert request.relay
    assert (request.expected_range.begin, request.expected_range.end) == (0, 10)
    assert list(request.tokens) == [5, 6]
    assert request.output.kind == pb.OUTPUT_KIND_SAMPLED and list(request.output.rows) == [1]


def test_a_decode_loop_asks_the_first_stage_for_the_rest_of_the_tokens(
    make_route_info: MakeRoute,
) -> None:
    request = loop_request(make_route_info(3, chained=True), KEY, 42, 9, 16, {7, 2}, SAMPLED,
                           COLD)
    assert (list(request.tokens), list(request.positions)) == ([42], [9])
    assert request.relay and request.continue_tokens == 15
    assert list(request.stop_token_ids) == [2, 7]
    assert request.output.kind == pb.OUTPUT_KIND_SAMPLED and list(request.output.rows) == [0]
    assert request.loop_drafts == 0 and not request.draft_context


def test_a_single_stage_loops_without_relaying_and_a_speculating_loop_gets_its_context(
    make_route_info: MakeRoute,
) -> None:
    request = loop_request(make_route_info(1), KEY, 42, 3, 8, set(), SAMPLED, COLD, drafts=4,
                           draft_context=[1, 2, 3])
    assert not request.relay
    assert request.loop_drafts == 4 and list(request.draft_context) == [1, 2, 3]


def test_a_verification_step_carries_its_drafts_and_drops_rejected_ones_first(
    make_route_info: MakeRoute,
) -> None:
    route = make_route_info(3)
    verified = verified_output(SAMPLED, 3)
    request = stage_request(route, 2, KEY, [5, 6, 7], 12, verified, COLD, pb.ForwardResponse(),
                            discard=True)
    assert request.output.kind == pb.OUTPUT_KIND_VERIFIED
    assert list(request.tokens) == [5, 6, 7]  # the last stage has no sideband: the drafts
    assert request.discard_from == 12
    assert request.output.sampling.seed == 7
    middle = stage_request(route, 1, KEY, [5, 6, 7], 12, verified, COLD, pb.ForwardResponse(),
                           discard=True)
    assert middle.discard_from == 12 and not middle.HasField("output") and not middle.tokens
    local = replace(SAMPLED, sample_locally=True)
    request = stage_request(route, 2, KEY, [5, 6, 7], 12, verified_output(local, 3), COLD,
                            pb.ForwardResponse())
    assert request.output.kind == pb.OUTPUT_KIND_LOGITS
    assert list(request.output.rows) == [0, 1, 2]
    assert not request.HasField("discard_from")


def test_every_builders_request_asks_the_prefix_cache_for_the_sessions_reuse(
    make_route_info: MakeRoute,
) -> None:
    route, chained = make_route_info(3), make_route_info(3, chained=True)
    salted = Reuse(salt=b"tenant")
    warm = salted.prefilling([1, 2, 3, 4], snapshot=8)
    assert warm == Reuse(b"tenant", (1, 2, 3, 4), 8)
    previous = pb.ForwardResponse(prefix_chain=[b"d1"])
    built = [
        stage_request(route, 0, KEY, [5, 6], 4, sampled(2), warm),
        stage_request(route, 1, KEY, [5, 6], 4, sampled(2), warm, previous),
        relay_request(chained, KEY, [5, 6], 4, sampled(2), warm),
    ]
    assert [r.cache_salt for r in built] == [b"tenant"] * 3
    assert [list(r.prefix_tokens) for r in built] == [[1, 2, 3, 4]] * 3
    # a later stage called by the driver matches the prefix with the previous stage's chain
    assert [list(r.prefix_chain) for r in built] == [[], [b"d1"], []]
    assert not any(r.prefix_snapshot for r in built)
    # the prefill's later steps: no prefix named, the snapshot asked where it starts
    later = stage_request(route, 0, KEY, [7] * 4, 8, sampled(4), warm)
    assert not later.prefix_tokens and later.prefix_snapshot and later.cache_salt == b"tenant"
    after = stage_request(route, 1, KEY, [7], 12, sampled(1), warm, previous)
    assert not after.prefix_tokens and not after.prefix_chain and not after.prefix_snapshot
    # verification and decoding steps: the salt alone
    loop = loop_request(chained, KEY, 42, 9, 16, set(), SAMPLED, salted)
    verify = relay_request(chained, KEY, [5, 6], 9, verified_output(SAMPLED, 2), salted)
    for request in (loop, verify):
        assert request.cache_salt == b"tenant"
        assert not request.prefix_tokens and not request.prefix_snapshot
    assert not stage_request(route, 0, KEY, [5], 0, sampled(1), COLD).cache_salt


def test_a_long_prompt_is_cut_to_fill_the_pipeline_at_batch_speed(
    make_route_info: MakeRoute,
) -> None:
    route = make_route_info(2)
    assert chunks(route, 1024) == [(s, s + 128) for s in range(0, 1024, 128)]  # 4 per stage
    assert chunks(route, 100) == [(0, MIN_CHUNK_TOKENS), (MIN_CHUNK_TOKENS, 100)]
    assert chunks(route, 100, chunk_tokens=32) == [(0, 32), (32, 64), (64, 96), (96, 100)]


def test_with_nothing_to_pipeline_a_prompt_goes_in_the_largest_steps(
    make_route_info: MakeRoute,
) -> None:
    assert chunks(make_route_info(1), 1200) == [(0, 512), (512, 1024), (1024, 1200)]
    deepseek4 = make_route_info(2, architecture="deepseek4")  # step-sensitive numerics
    assert chunks(deepseek4, 600) == [(0, 512), (512, 600)]
    assert chunks(deepseek4, 600, chunk_tokens=2000) == [(0, 512), (512, 600)]
