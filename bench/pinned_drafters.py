"""The pinned llama.cpp's own draft paths (`draft-mtp`, `draft-dspark`) on the tiny test
models: a deepseek4 target with an MTP block and a DSpark drafter for it. Prints per drafter:
drafting passes, drafted and accepted tokens, ms per drafting pass, and whether the text
equals the other drafter's (greedy verification keeps the target's text).

    .venv/bin/python bench/pinned_drafters.py [--layers 8|43] [--tokens 32] [--draft-max 4]

Random weights: acceptance says the path runs, not how well a trained drafter drafts.
See meshnet.devtools.pinned_draft for how the pin's example is built.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

from meshnet.devtools.pinned_draft import build_speculative_example, run_draft
from meshnet.devtools.tiny_deepseek4 import SMALL, write_tiny_deepseek4
from meshnet.devtools.tiny_dspark import DSPARK, write_tiny_dspark

PROMPT = "Hello the map of the world and the story of the sea coast line chart."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=SMALL.n_layer)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--draft-max", type=int, default=DSPARK.block_size - 1)
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="meshnet-pinned-drafters-"))
    shape = dataclasses.replace(SMALL, n_layer=options.layers, mtp_layers=1)
    target = write_tiny_deepseek4(work / "target-mtp.gguf", shape, seed=1)
    drafter = write_tiny_dspark(work / "dspark.gguf", shape, DSPARK, seed=4)
    binary = build_speculative_example(work)
    print(f"{options.layers}-layer target, {options.tokens} tokens, up to {options.draft_max} "
          "drafts per pass")
    print(f"{'drafter':<14}{'passes':>8}{'drafted':>9}{'accepted':>10}{'ms/pass':>9}")
    texts = set()
    for kind, model in (("draft-mtp", None), ("draft-dspark", drafter)):
        run = run_draft(binary, target, kind, model, PROMPT, options.tokens, options.draft_max)
        texts.add(run.text)
        print(f"{kind:<14}{run.passes:>8}{run.drafted:>9}{run.accepted:>10}"
              f"{run.draft_ms / max(run.passes, 1):>9.2f}")
    print("same text with either drafter:", len(texts) == 1)


if __name__ == "__main__":
    main()
