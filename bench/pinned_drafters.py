"""The pinned llama.cpp's own draft paths (`draft-mtp`, `draft-dspark` in common/speculative.cpp)
on the tiny test models: a deepseek4 target with an MTP block and a DSpark drafter for it.
Prints per drafter: drafting passes, drafted and accepted tokens, ms per drafting pass, and
whether the text equals the other drafter's (greedy verification keeps the target's text).

    .venv/bin/python bench/pinned_drafters.py [--layers 8|43] [--tokens 32] [--draft-max 4]

The pin's build installs no header of its `common` library, so this compiles llama.cpp's
own speculative-simple example from the pin workspace (.work/llama.cpp) against the static
libraries of the cached pin build (.work/llama-build/build); nothing of it enters the repo.
Random weights: acceptance says the path runs, not how well a trained drafter drafts.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import subprocess
import tempfile
from pathlib import Path

from meshnet.devtools.tiny_deepseek4 import SMALL, write_tiny_deepseek4
from meshnet.devtools.tiny_dspark import DSPARK, write_tiny_dspark
from meshnet.paths import workspace

PROMPT = "Hello the map of the world and the story of the sea coast line chart."
# the libraries of the pin build the example needs, in link order
LIBRARIES = ["common/libllama-common.a", "common/libllama-common-base.a", "src/libllama.a",
             "ggml/src/libggml.a", "ggml/src/ggml-rpc/libggml-rpc.a", "ggml/src/libggml-cpu.a",
             "ggml/src/libggml-base.a", "vendor/cpp-httplib/libcpp-httplib.a",
             "vendor/hash/libvendor-hash.a"]
STATISTICS = re.compile(r"statistics\s+(?P<kind>[\w-]+):.*#gen drafts =\s*(?P<passes>\d+).*"
                        r"#gen tokens =\s*(?P<drafted>\d+), #acc tokens =\s*(?P<accepted>\d+)"
                        r".*dur\(b,g,a\) = [\d.]+, (?P<ms>[\d.]+),")


def build_example(out: Path) -> Path:
    source, build = workspace() / "llama.cpp", (workspace() / "llama-build").resolve() / "build"
    binary = out / "llama-speculative-simple"
    includes = [f"-I{source / d}" for d in ("common", "include", "ggml/include", "vendor", "src")]
    subprocess.run(["g++", "-std=c++17", "-O2", "-fopenmp", *includes,
                    str(source / "examples/speculative-simple/speculative-simple.cpp"),
                    "-o", str(binary), *(str(build / lib) for lib in LIBRARIES),
                    "-lpthread", "-ldl"], check=True)
    return binary


def run(binary: Path, target: Path, kind: str, drafter: Path | None, tokens: int,
        draft_max: int) -> tuple[dict[str, str], str]:
    # -nr: the pin's AMX repack of Q8_0 weights crashes on our machines
    args = [str(binary), "-m", str(target), "--spec-type", kind, "-nr", "-p", PROMPT,
            "-n", str(tokens), "-t", "1", "-c", "1024", "--temp", "0", "-lv", "4",
            "--spec-draft-n-max", str(draft_max)]
    if drafter:
        args += ["-md", str(drafter)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, check=True)
    found = STATISTICS.search(proc.stderr)
    if not found:
        raise SystemExit(f"{kind}: no statistics line in the output:\n{proc.stderr[-3000:]}")
    return found.groupdict(), proc.stdout


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
    binary = build_example(work)
    texts = {}
    print(f"{options.layers}-layer target, {options.tokens} tokens, up to {options.draft_max} "
          "drafts per pass")
    print(f"{'drafter':<14}{'passes':>8}{'drafted':>9}{'accepted':>10}{'ms/pass':>9}")
    for kind, model in (("draft-mtp", None), ("draft-dspark", drafter)):
        stats, texts[kind] = run(binary, target, kind, model, options.tokens, options.draft_max)
        passes = int(stats["passes"])
        print(f"{kind:<14}{passes:>8}{stats['drafted']:>9}{stats['accepted']:>10}"
              f"{float(stats['ms']) / max(passes, 1):>9.2f}")
    print("same text with either drafter:", len(set(texts.values())) == 1)


if __name__ == "__main__":
    main()
