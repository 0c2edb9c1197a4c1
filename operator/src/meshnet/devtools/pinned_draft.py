"""The pinned llama.cpp's own draft paths (`draft-mtp`, `draft-dspark` in common/speculative.cpp),
to check our drafter test models against them.

The pin's build installs no header of its `common` library, so this compiles llama.cpp's
own speculative-simple example from the pin workspace (.work/llama.cpp) against the static
libraries the cached pin build keeps (.work/llama-build/build): a dev-machine check on the
CPU lane; nothing of it enters the repo or an image.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from meshnet.paths import workspace

# the libraries of the pin build the example needs, in link order
LIBRARIES = ["common/libllama-common.a", "common/libllama-common-base.a", "src/libllama.a",
             "ggml/src/libggml.a", "ggml/src/ggml-rpc/libggml-rpc.a", "ggml/src/libggml-cpu.a",
             "ggml/src/libggml-base.a", "vendor/cpp-httplib/libcpp-httplib.a",
             "vendor/hash/libvendor-hash.a"]
_STATISTICS = re.compile(r"statistics\s+(?P<kind>[\w-]+):.*#gen drafts =\s*(?P<passes>\d+).*"
                         r"#gen tokens =\s*(?P<drafted>\d+), #acc tokens =\s*(?P<accepted>\d+)"
                         r".*dur\(b,g,a\) = [\d.]+, (?P<ms>[\d.]+),")


@dataclass(frozen=True)
class DraftRun:
    kind: str  # draft-mtp | draft-dspark
    passes: int  # drafting passes
    drafted: int  # tokens proposed
    accepted: int  # tokens the target accepted
    draft_ms: float  # time spent drafting, all passes
    text: str  # what the target generated (greedy: the same whatever drafts)


def build_speculative_example(out: Path) -> Path:
    """Compile the pin's speculative-simple example into `out`; CalledProcessError if the
    pin workspace or its build is missing (`make build` makes both)."""
    source, build = workspace() / "llama.cpp", (workspace() / "llama-build").resolve() / "build"
    binary = out / "llama-speculative-simple"
    includes = [f"-I{source / d}" for d in ("common", "include", "ggml/include", "vendor", "src")]
    subprocess.run(["g++", "-std=c++17", "-O2", "-fopenmp", *includes,
                    str(source / "examples/speculative-simple/speculative-simple.cpp"),
                    "-o", str(binary), *(str(build / lib) for lib in LIBRARIES),
                    "-lpthread", "-ldl"], check=True, capture_output=True, text=True)
    return binary


def run_draft(binary: Path, target: Path, kind: str, drafter: Path | None, prompt: str,
              tokens: int, draft_max: int) -> DraftRun:
    """Greedy generation of `target` with the pinned `kind` drafting path, one thread."""
    # -nr: the pin's AMX repack of Q8_0 weights crashes on our machines (the worker turns
    # it off too)
    args = [str(binary), "-m", str(target), "--spec-type", kind, "-nr", "-p", prompt,
            "-n", str(tokens), "-t", "1", "-c", "1024", "--temp", "0", "-lv", "4",
            "--spec-draft-n-max", str(draft_max)]
    if drafter:
        args += ["-md", str(drafter)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, check=True)
    found = _STATISTICS.search(proc.stderr)
    if not found:
        raise RuntimeError(f"{kind}: no statistics line in the output:\n{proc.stderr[-3000:]}")
    return DraftRun(found["kind"], int(found["passes"]), int(found["drafted"]),
                    int(found["accepted"]), float(found["ms"]), proc.stdout)
