"""A memory that cannot drop a suffix of a session's positions (deepseek4's compressed
caches): the worker says so in GetInfo, refuses `discard_from` with DISCARD_UNSUPPORTED
leaving the session as it was, and the driver asked to speculate on such a route decodes
plainly, with the same tokens. Started with --discard-depth N it keeps N snapshots of that
state per session: a discard of up to N positions goes on exactly as a session that never
held them, a deeper one is refused with DISCARD_TOO_DEEP, and speculation gives the plain
tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, start_route
from meshnet.route import RouteDriver, StageClient, StageError
from meshnet.route.proto import pb

pytestmark = pytest.mark.slow

ROUTE_ID = "test/deepseek4-discard"
PROMPT = "the map of the world and the map of the world and the map of the"


@pytest.fixture(scope="module")
def worker(shard_worker: Path, ds4_small: Path, tmp_path_factory: pytest.TempPathFactory,
           ) -> Iterator[WorkerProcess]:
    spec = LaunchSpec(model=ds4_small, layers=LayerRange(0, 8), route_id=ROUTE_ID, threads=1,
                      ctx=512)
    workers = start_route(shard_worker, [spec], tmp_path_factory.mktemp("ds4-discard"))
    yield workers[0]
    workers[0].stop()


def test_discard_is_refused_with_its_reason_and_the_session_kept(worker: WorkerProcess) -> None:
    client = StageClient(worker.endpoint)
    try:
        assert not client.info().can_discard
        key = pb.RouteKey(route_id=ROUTE_ID, epoch=1, session_id="s")
        prompt = client.tokenize(PROMPT)
        sampled = pb.OutputRequest(kind=pb.OUTPUT_KIND_SAMPLED)
        step = pb.ForwardRequest(key=key, n_past=0, positions=range(len(prompt)),
                                 tokens=prompt, output=sampled)
        first = client.forward(step).sampled_tokens[0]
        n = len(prompt)
        rewind = pb.ForwardRequest(key=key, n_past=n - 1, positions=[n - 1], tokens=[first],
                                   output=sampled, discard_from=n - 1)
        with pytest.raises(StageError) as refused:
            client.forward(rewind)
        assert (refused.value.code, refused.value.reason) == (
            "FAILED_PRECONDITION", "DISCARD_UNSUPPORTED")
        go_on = pb.ForwardRequest(key=key, n_past=n, positions=[n], tokens=[first],
                                  output=sampled)
        assert client.forward(go_on).n_past == n + 1  # the session is as it was
    finally:
        client.close()


def test_the_driver_decodes_plainly_where_a_stage_cannot_discard(worker: WorkerProcess) -> None:
    with RouteDriver([worker.endpoint]) as driver:
        assert not driver.connect().can_discard
        plain = driver.generate(PROMPT, max_tokens=16, stop_at_eos=False)
        asked = driver.generate(PROMPT, max_tokens=16, stop_at_eos=False, speculate=4)
    assert asked.speculate == 0 and asked.draft_tokens == 0
    assert asked.tokens == plain.tokens


DEPTH = 7


@pytest.fixture(scope="module")
def deep_worker(shard_worker: Path, ds4_small: Path, tmp_path_factory: pytest.TempPathFactory,
                ) -> Iterator[WorkerProcess]:
    spec = LaunchSpec(model=ds4_small, layers=LayerRange(0, 8), route_id=ROUTE_ID, threads=1,
                      ctx=512, extra=("--discard-depth", str(DEPTH)))
    workers = start_route(shard_worker, [spec], tmp_path_factory.mktemp("ds4-deep-discard"))
    yield workers[0]
    workers[0].stop()


def test_with_snapshots_a_discard_goes_on_exactly_and_a_deeper_one_is_refused(
        deep_worker: WorkerProcess) -> None:
    client = StageClient(deep_worker.endpoint)
    try:
        info = client.info()
        assert info.can_discard and info.discard_depth == DEPTH
        sampled = pb.OutputRequest(kind=pb.OUTPUT_KIND_SAMPLED)
        prompt = client.tokenize(PROMPT)
        n = len(prompt)

        def key(session: str) -> pb.RouteKey:
            return pb.RouteKey(route_id=ROUTE_ID, epoch=1, session_id=session)

        def forward(session: str, n_past: int, tokens: list[int], **kw: int) -> pb.ForwardResponse:
            return client.forward(pb.ForwardRequest(
                key=key(session), n_past=n_past, positions=range(n_past, n_past + len(tokens)),
                tokens=tokens, output=sampled, **kw))

        first = forward("spec", 0, prompt).sampled_tokens[0]
        assert forward("plain", 0, prompt).sampled_tokens[0] == first
        # a window [first, 3 drafts] of which only `first` is kept; "plain" never held the drafts
        forward("spec", n, [first, 7, 8, 9])
        forward("plain", n, [first])
        go_on = forward("spec", n + 1, [11], discard_from=n + 1)
        assert go_on.n_past == n + 2
        assert go_on.sampled_tokens == forward("plain", n + 1, [11]).sampled_tokens

        # two windows of 8 in flight: the snapshots reach back DEPTH positions, not 9
        forward("spec", n + 2, [3] * 8)
        forward("spec", n + 10, [4] * 8)
        with pytest.raises(StageError) as refused:
            forward("spec", n + 9, [5], discard_from=n + 9)
        assert (refused.value.code, refused.value.reason) == (
            "FAILED_PRECONDITION", "DISCARD_TOO_DEEP")
        assert refused.value.metadata == {"discard_depth": str(DEPTH), "positions": "9"}
        assert forward("spec", n + 18, [5]).n_past == n + 19  # the session is as it was
    finally:
        client.close()


def test_the_driver_speculates_within_the_depth_with_the_plain_tokens(
        deep_worker: WorkerProcess) -> None:
    with RouteDriver([deep_worker.endpoint]) as driver:
        assert driver.connect().can_discard
        plain = driver.generate(PROMPT, max_tokens=16, stop_at_eos=False)
        asked = driver.generate(PROMPT, max_tokens=16, stop_at_eos=False, speculate=4)
    assert asked.speculate == 4
    assert asked.tokens == plain.tokens
