"""The route handshake accepts one consistent, contiguous, complete route and refuses
anything else with every problem named."""

from __future__ import annotations

import pytest

from meshnet.api.drafter_kind import DrafterKind
from meshnet.route import RouteRefused, check_route
from meshnet.route.proto import pb


def info(begin: int, end: int, **changes: object) -> pb.GetInfoResponse:
    answer = pb.GetInfoResponse(
        protocol="meshnet.shard.v1", incarnation=f"inc-{begin}", route_id="default/r", epoch=4,
        manifest_digest="m" * 64, recipe_digest="r" * 64, architecture="llama", n_layer=30,
        layers=pb.LayerRange(begin=begin, end=end), n_embd=576, n_vocab=49152, has_vocab=True,
        boundary=pb.BoundarySpec(schema=pb.BOUNDARY_SCHEMA_DENSE_RESIDUAL,
                                 dtype=pb.BOUNDARY_DTYPE_F32, row_shape=[576]),
        n_ctx=4096, n_slots=4, max_step_tokens=512, eos_token_ids=[2],
    )
    for name, value in changes.items():
        if name == "dtype":
            answer.boundary.dtype = value  # type: ignore[assignment]
        elif name == "drafter":
            answer.drafter.CopyFrom(value)  # type: ignore[arg-type]
        else:
            setattr(answer, name, value)
    return answer


def route(*stages: pb.GetInfoResponse) -> list[tuple[str, pb.GetInfoResponse]]:
    return [(f"127.0.0.1:{7000 + i}", stage) for i, stage in enumerate(stages)]


def refusal(*stages: pb.GetInfoResponse) -> str:
    with pytest.raises(RouteRefused) as caught:
        check_route(route(*stages))
    return str(caught.value)


def test_a_contiguous_complete_route_is_accepted_with_its_identities() -> None:
    checked = check_route(route(info(0, 10), info(10, 20), info(20, 30)))
    assert [(s.begin, s.end) for s in checked.stages] == [(0, 10), (10, 20), (20, 30)]
    assert checked.epoch == 4
    assert checked.eos_token_ids == (2,)
    assert checked.seam_bytes_per_token == 576 * 4


def test_a_gap_between_stages_is_refused() -> None:
    assert "a gap" in refusal(info(0, 10), info(12, 30))


def test_overlapping_stages_are_refused() -> None:
    assert "an overlap" in refusal(info(0, 12), info(10, 30))


def test_a_route_that_stops_short_of_the_last_layer_is_refused() -> None:
    assert "not all 30 layers" in refusal(info(0, 10), info(10, 20))


def test_stages_in_the_wrong_order_are_refused() -> None:
    message = refusal(info(10, 30), info(0, 10))
    assert "starting at layer 0" in message


def test_stages_of_different_artifacts_or_recipes_are_refused() -> None:
    assert "artifact" in refusal(info(0, 10), info(10, 30, manifest_digest="x" * 64))
    assert "recipe" in refusal(info(0, 10), info(10, 30, recipe_digest="y" * 64))


def test_stages_on_different_epochs_are_refused() -> None:
    assert "epoch" in refusal(info(0, 10), info(10, 30, epoch=5))


def test_stages_of_different_routes_are_refused() -> None:
    assert "route id" in refusal(info(0, 10), info(10, 30, route_id="default/other"))


def test_stages_with_different_boundaries_are_refused() -> None:
    assert "boundary" in refusal(info(0, 10), info(10, 30, dtype=pb.BOUNDARY_DTYPE_F16))


def test_a_stage_speaking_another_protocol_is_refused() -> None:
    assert "meshnet.shard.v2" in refusal(info(0, 10), info(10, 30, protocol="meshnet.shard.v2"))


def test_a_route_without_any_vocabulary_is_refused() -> None:
    assert "tokenize" in refusal(info(0, 10, has_vocab=False), info(10, 30, has_vocab=False))


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(RouteRefused) as caught:
        check_route(route(info(0, 10), info(12, 20, epoch=9)))
    assert len(caught.value.problems) == 3  # epoch, gap, coverage


def placed(begin: int, end: int, host: str = "boot-1", cpus: tuple[int, ...] = (0, 1),
           threads: int = 2, gpu_layers: int = 0) -> pb.GetInfoResponse:
    answer = info(begin, end)
    answer.placement.CopyFrom(pb.ComputePlacement(host_id=host, cpus=cpus, threads=threads,
                                                  gpu_layers=gpu_layers))
    return answer


def test_stages_that_each_fill_one_hosts_cpus_take_turns() -> None:
    assert check_route(route(placed(0, 15), placed(15, 30))).stages_take_turns
    # pinned to the same two CPUs of a bigger host: still both on those two
    assert check_route(route(placed(0, 15, cpus=(4, 5)), placed(15, 30, cpus=(4, 5)))
                       ).stages_take_turns


@pytest.mark.parametrize("second", [
    placed(15, 30, threads=1),              # 2 + 1 threads on 2 CPUs: both can compute
    placed(15, 30, cpus=(2, 3)),            # CPUs of their own
    placed(15, 30, host="boot-2"),          # another host
    placed(15, 30, host=""),                # a worker that does not say
    placed(15, 30, gpu_layers=999),         # computes on a GPU
])
def test_stages_that_can_compute_at_once_do_not_take_turns(second: pb.GetInfoResponse) -> None:
    assert not check_route(route(placed(0, 15), second)).stages_take_turns


def test_a_route_of_one_stage_or_without_placements_never_takes_turns() -> None:
    assert not check_route(route(placed(0, 30))).stages_take_turns
    assert not check_route(route(info(0, 15), info(15, 30))).stages_take_turns
    assert not check_route(route(placed(0, 15, threads=1), placed(15, 30, threads=1))
                           ).stages_take_turns


def test_a_route_that_drafts_needs_its_drafter_on_the_last_stage() -> None:
    hosting = info(20, 30, drafter=pb.DrafterInfo(kind="mtp", max_drafts=3))
    asked = check_route(route(info(0, 20), hosting), drafter=DrafterKind.MTP)
    assert asked.drafter is DrafterKind.MTP
    assert check_route(route(info(0, 20), hosting)).drafter is DrafterKind.MTP  # hosted, not asked
    for last in (info(20, 30), info(20, 30, drafter=pb.DrafterInfo(kind="dspark"))):
        with pytest.raises(RouteRefused) as caught:
            check_route(route(info(0, 20), last), drafter=DrafterKind.MTP)
        assert caught.value.reason == "DrafterMissing"
        hosted = last.drafter.kind or "no drafter"
        assert (f"the route drafts with mtp, but its last stage 127.0.0.1:7001 hosts {hosted}"
                in str(caught.value))
