"""`meshnet up` on route files as users have them: the example route, whose recipe says
nothing of the prefix cache, reuses a repeated prompt's prefix (on by default); a file of
the last release, whose recipe carries the removed `mtp`, serves with a warning naming what
replaced it."""

from __future__ import annotations

from collections.abc import Callable

import yaml

from .conftest import EXAMPLE, UpSession

# about 200 tokens: past the default block (128) for llama
PROMPT = ("A shared system prompt for an agent: read the files you are given, plan the change, "
          "write the tests first, run them, fix what fails, and report what you did. ") * 7


def test_the_example_route_reuses_a_repeated_prompt_with_no_prefix_cache_in_its_recipe(
    up: UpSession,
) -> None:
    assert "prefixCache" not in EXAMPLE.read_text()  # the file as a new user gets it
    up.wait_for(lambda r: r["epoch"] == 1 and len(r["stages"]) == 3)
    cold = up.generate(PROMPT, max_tokens=8)
    again = up.generate(PROMPT, max_tokens=8)
    assert len(cold["prompt_tokens"]) > 129
    assert cold["cached_tokens"] == 0
    assert again["cached_tokens"] >= 128 and again["cached_tokens"] % 128 == 0
    assert again["tokens"] == cold["tokens"]


def test_a_route_file_of_the_last_release_with_recipe_mtp_serves_on_with_a_warning(
    up: UpSession, reference: Callable[..., list[int]],
) -> None:
    first = up.wait_for(lambda r: r["epoch"] == 1 and len(r["stages"]) == 3)
    pids = [s["pid"] for s in first["stages"]]
    docs = list(yaml.safe_load_all(up.route_file.read_text()))
    docs[1]["spec"]["recipe"]["mtp"] = "Disabled"  # as every 0.1 manifest had it
    up.route_file.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    said = up.said("RemovedField")
    assert "spec.recipe.mtp: mtp was removed" in said and "recipe.speculation" in said
    answer = up.generate("The three primary colors are", max_tokens=8)
    assert answer["route"]["epoch"] == 1  # the same recipe: the same epoch and workers
    assert [s["pid"] for s in up.wait_for(lambda r: True)["stages"]] == pids
    assert answer["tokens"] == reference(answer["prompt_tokens"], len(answer["tokens"]))

    docs[1]["spec"]["recipe"]["mtp"] = "Enabled"  # a meaning speculation does not keep
    up.route_file.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    said = up.said("invalid spec")
    assert "spec.recipe.mtp" in said and "recipe.speculation" in said
    assert "ignoring the changed file (epoch 1 runs on)" in said
