"""A route's prefix cache across a re-split on one machine: a request repeated at the same
epoch reuses its prompt's prefix on every stage, and after the stages are cut anew (a new
epoch, new workers) nothing of the old epoch is reused - the first request is a cold run
again, with the same tokens."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import yaml

from .conftest import UpSession

# about 150 tokens: several 32-token blocks to reuse
PROMPT = ("A shared system prompt for an agent: read the files you are given, plan the change, "
          "write the tests first, run them, fix what fails, and report what you did. ") * 3


def prefix_flags(pid: int) -> dict[str, str]:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return {a: args[i + 1] for i, a in enumerate(args)
            if a in ("--prefix-cache-entries", "--prefix-block")}


def test_a_resplit_route_serves_its_first_request_cold_with_the_same_tokens(
    make_up: Callable[..., UpSession],
) -> None:
    up = make_up()
    plain = up.wait_for(lambda r: r["epoch"] == 1 and len(r["stages"]) == 3)
    docs = list(yaml.safe_load_all(up.route_file.read_text()))
    docs[1]["spec"]["recipe"]["prefixCache"] = {"entries": 2, "block": 32}
    up.route_file.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    caching = up.wait_for(lambda r: len(r["stages"]) == 3 and all(
        s["pid"] != old["pid"] for s, old in zip(r["stages"], plain["stages"], strict=True)))
    assert caching["epoch"] == 1  # the cache changes no token: no new epoch
    assert [prefix_flags(s["pid"]) for s in caching["stages"]] == [
        {"--prefix-cache-entries": "2", "--prefix-block": "32"}] * 3

    cold = up.generate(PROMPT, max_tokens=8)
    hit = up.generate(PROMPT, max_tokens=8)
    assert cold["cached_tokens"] == 0
    assert hit["cached_tokens"] >= 64 and hit["cached_tokens"] % 32 == 0
    assert hit["tokens"] == cold["tokens"]

    up.set_stages([("front", 0, 15), ("back", 15, 30)])
    deadline = time.monotonic() + 120
    while True:  # the old epoch's workers have stopped: every answer comes from epoch 2
        resplit = up.wait_for(lambda r: r["epoch"] == 2 and len(r["stages"]) == 2)
        if not any(s["pid"] == old["pid"] for s in resplit["stages"]
                   for old in caching["stages"]):
            break
        assert time.monotonic() < deadline
    first = up.generate(PROMPT, max_tokens=8)
    again = up.generate(PROMPT, max_tokens=8)
    assert first["route"]["epoch"] == again["route"]["epoch"] == 2
    assert first["cached_tokens"] == 0  # nothing of epoch 1 is reused
    assert first["tokens"] == again["tokens"] == cold["tokens"]
    assert again["cached_tokens"] >= 64  # epoch 2 caches its own
