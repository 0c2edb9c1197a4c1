"""`meshnet serve --speculate`: the answers are the solo greedy ones, and the accepted drafts
show in usage (completion_tokens_details, as OpenAI reports predicted outputs) and in
/metrics (meshnet_spec_decode_num_*_tokens)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import openai
import pytest

from meshnet.local.process import WorkerProcess

from .conftest import MODEL, Gateway, key_args, start_gateway

pytestmark = pytest.mark.slow

CODE = (
    "# Original:\ndef sum_list(values):\n    total = 0\n    for value in values:\n"
    "        total = total + value\n    return total\n\ndef mean(values):\n"
    "    total = sum_list(values)\n    return total / len(values)\n\n"
    "# The same code with type hints added:\ndef sum_list(values: list[float]) -> float:\n"
)


@pytest.fixture(scope="module")
def speculating(route: list[WorkerProcess], tmp_path_factory: pytest.TempPathFactory,
                ) -> Iterator[Gateway]:
    served = start_gateway([w.endpoint for w in route],
                           tmp_path_factory.mktemp("gateway-spec") / "serve.log", "--speculate",
                           *key_args(route))
    yield served
    served.stop()


def counter(gateway: Gateway, name: str) -> float:
    for line in httpx.get(gateway.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not in /metrics")


def test_a_speculated_completion_is_the_solo_answer_with_its_drafts_in_usage_and_metrics(
    speculating: Gateway, solo: Callable[..., str],
) -> None:
    client = openai.OpenAI(base_url=speculating.base_url, api_key="unused", max_retries=0)
    answer = client.completions.create(model=MODEL, prompt=CODE, temperature=0, max_tokens=40)
    assert answer.choices[0].text == solo(prompt=CODE, max_tokens=40)
    assert answer.usage is not None and answer.usage.completion_tokens == 40
    details = answer.usage.completion_tokens_details
    assert details is not None and details.accepted_prediction_tokens
    assert details.accepted_prediction_tokens > (details.rejected_prediction_tokens or 0)
    drafted = counter(speculating, "meshnet_spec_decode_num_draft_tokens_total")
    accepted = counter(speculating, "meshnet_spec_decode_num_accepted_tokens_total")
    assert accepted == details.accepted_prediction_tokens
    assert drafted == accepted + (details.rejected_prediction_tokens or 0)
