"""A chat through the gateway of a route with the prefix cache on: every turn after the
first starts from what the stages cached of the conversation so far, reports it as
usage.prompt_tokens_details.cached_tokens, and answers what a cold run answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.gateway.chat import chat_prompt
from meshnet.local.process import LaunchSpec, WorkerProcess, route_key_of, start_route
from meshnet.route import RouteDriver

from .conftest import MODEL, SLOTS, Gateway, key_args, start_gateway

BLOCK = 64
SYSTEM = ("You are a careful assistant for a shipping company. " * 30).strip()
QUESTIONS = ["Where is my parcel?", "How long does customs take?",
             "Can I change the address?", "What does express cost?"]


@pytest.fixture(scope="module")
def route(shard_worker: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory,
          ) -> Iterator[list[WorkerProcess]]:
    specs = [LaunchSpec(model=smollm2, layers=LayerRange(*span), route_id="test/gateway",
                        threads=1, slots=SLOTS, prefix_cache_entries=2, prefix_block=BLOCK)
             for span in [(0, 15), (15, 30)]]
    workers = start_route(shard_worker, specs, tmp_path_factory.mktemp("prefix-gateway"),
                          chain=True)
    yield workers
    for worker in workers:
        worker.stop()


def test_every_turn_of_a_chat_after_the_first_hits_and_answers_as_a_cold_run(
    gateway: Gateway, route: list[WorkerProcess],
) -> None:
    api = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}]
    answers, cached = [], []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        answer = api.chat.completions.create(model=MODEL, messages=messages,  # type: ignore[arg-type]
                                             temperature=0, max_tokens=16)
        details = answer.usage.prompt_tokens_details  # type: ignore[union-attr]
        cached.append(details.cached_tokens if details else None)
        text = answer.choices[0].message.content or ""
        answers.append(text)
        messages.append({"role": "assistant", "content": text})
    assert cached[0] == 0
    assert all(n is not None and n >= BLOCK for n in cached[1:]), cached
    assert cached[1:] == sorted(cached[1:])  # each turn reuses at least the turn before's

    with RouteDriver([w.endpoint for w in route],
                     route_key=route_key_of(route), reuse_prefix=False) as cold:
        template, eos = cold.route.chat_template, set(cold.route.eos_token_ids)
        for turn, text in enumerate(answers):
            history = messages[:2 + 2 * turn]
            prompt = chat_prompt(template, history)
            run = cold.generate(cold.tokenize(prompt.text, prompt.literal), max_tokens=16)
            tokens = [t for t in run.tokens if t not in eos]
            assert run.cached_tokens == 0
            assert cold.detokenize(tokens) == text


def test_a_tenants_prefix_is_reused_for_its_salt_only(gateway: Gateway) -> None:
    """The probe: another client guesses a secret in a victim's prompt and asks whether the
    stages cached it (cached_tokens, or a faster first token). With cache_salt, they never
    hit another salt's entries, nor the shared cache's; the same salt still reuses."""
    api = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    secret = [{"role": "system", "content": SYSTEM + " The vault code is 4721."},
              {"role": "user", "content": "Hello."}]

    def ask(salt: str | None) -> tuple[int, str]:
        extra = {"cache_salt": salt} if salt is not None else {}
        answer = api.chat.completions.create(model=MODEL, messages=secret,  # type: ignore[arg-type]
                                             temperature=0, max_tokens=8, extra_body=extra)
        details = answer.usage.prompt_tokens_details  # type: ignore[union-attr]
        cached = (details.cached_tokens or 0) if details else 0
        return cached, answer.choices[0].message.content or ""

    # the stages keep 2 entries and each released session takes one: the victim asks again
    # after one probe, while its entry is still there, and the unsalted probe comes last
    victim = ask("victim")
    probes = [ask("attacker")]
    again = ask("victim")
    probes.append(ask(None))
    assert victim[0] == 0
    assert [cached for cached, _ in probes] == [0, 0]
    assert again[0] >= BLOCK
    assert {text for _, text in [victim, *probes, again]} == {victim[1]}  # the same answer


def test_with_api_keys_a_stranger_gets_401_and_each_key_its_own_cache(
    route: list[WorkerProcess], tmp_path: Path,
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-victim\nsk-prober\n")
    served = start_gateway([w.endpoint for w in route], tmp_path / "serve.log",
                           "--api-keys", str(keys), "--cached-tokens", "report", *key_args(route))
    try:
        chat = {"model": MODEL, "max_tokens": 4, "temperature": 0, "messages": [
            {"role": "system", "content": SYSTEM + " The payroll password is tulip-9."},
            {"role": "user", "content": "Hi."}]}

        def post(key: str | None) -> httpx.Response:
            headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
            return httpx.post(served.base_url + "/chat/completions", json=chat,
                              headers=headers, timeout=120)

        for key in (None, "sk-guess", "sk-victi"):
            refused = post(key)
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(served.url + "/health", timeout=5).status_code == 200
        assert httpx.get(served.url + "/ready", timeout=5).status_code == 200
        metrics = httpx.get(served.url + "/metrics", timeout=5).text
        assert 'status="unauthorized"} 3.0' in metrics

        def cached(key: str) -> int:
            answer = post(key)
            assert answer.status_code == 200, answer.text
            return int(answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

        assert cached("sk-victim") == 0
        assert cached("sk-prober") == 0  # another key never hits the victim's entry
        assert cached("sk-victim") >= BLOCK  # the same key does
    finally:
        served.stop()


def test_a_route_may_keep_cached_tokens_out_of_responses(
    route: list[WorkerProcess], tmp_path: Path,
) -> None:
    served = start_gateway([w.endpoint for w in route], tmp_path / "serve.log",
                           "--cached-tokens", "hide", *key_args(route))
    try:
        answer = httpx.post(served.base_url + "/completions", timeout=120, json={
            "model": MODEL, "prompt": SYSTEM, "max_tokens": 2})
        assert answer.status_code == 200
        assert "prompt_tokens_details" not in answer.json()["usage"]
    finally:
        served.stop()
