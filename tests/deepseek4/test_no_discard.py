"""A memory that cannot drop a suffix of a session's positions (deepseek4's compressed
caches): the worker says so in GetInfo, refuses `discard_from` with DISCARD_UNSUPPORTED
leaving the session as it was, and the driver asked to speculate on such a route decodes
plainly, with the same tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meshnet.layers import LayerRange
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
