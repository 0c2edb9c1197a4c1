"""Token sampling, bit-for-bit the last stage's (worker/service/speculation/sampling.cpp).

Temperature 0 is greedy (argmax, lowest id on ties). Otherwise: rank by logit (ties:
lower id first), keep top_k, weigh by exp((l - max) / T), keep the smallest prefix
whose normalised mass reaches top_p, and pick with one uniform draw that depends only
on (seed, position) - so a re-prefilled session draws the same tokens again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 0.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def __post_init__(self) -> None:
        if self.temperature < 0 or self.top_k < 0 or not 0.0 <= self.top_p <= 1.0:
            raise ValueError("sampling needs temperature >= 0, top_k >= 0, 0 <= top_p <= 1")
        if not 0 <= self.seed <= _MASK:
            raise ValueError("seed must fit in 64 bits")


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def uniform(seed: int, position: int) -> float:
    """The draw in [0, 1) for the row at `position`."""
    z = splitmix64(seed ^ splitmix64(position & _MASK))
    return (z >> 11) * (1.0 / 9007199254740992.0)


def ranked(logits: npt.NDArray[np.float32], k: int) -> npt.NDArray[np.int64]:
    """Ids of the k highest logits, descending, lower id first on ties."""
    ids = np.arange(logits.shape[0])
    order = np.lexsort((ids, -logits.astype(np.float64)))
    return order[:k]


def sample(logits: npt.NDArray[np.float32], sampling: Sampling, position: int) -> int:
    logits = np.asarray(logits, dtype=np.float32)
    if sampling.greedy:
        return int(np.argmax(logits))
    n_vocab = logits.shape[0]
    k = min(sampling.top_k, n_vocab) if sampling.top_k > 0 else n_vocab
    candidates = ranked(logits, k)
    values = logits[candidates].astype(np.float64)
    temperature = float(np.float32(sampling.temperature))
    weights = np.exp((values - values[0]) / temperature)
    kept = len(weights)
    top_p = float(np.float32(sampling.top_p))
    if 0.0 < top_p < 1.0:
        total = float(np.cumsum(weights)[-1])
        reached = np.nonzero(np.cumsum(weights / total) >= top_p)[0]
        if len(reached):
            kept = int(reached[0]) + 1
    cumulative = np.cumsum(weights[:kept])
    target = uniform(sampling.seed, position) * float(cumulative[-1])
    index = int(np.searchsorted(cumulative, target, side="right"))
    return int(candidates[min(index, kept - 1)])


def verify_drafts(rows: npt.NDArray[np.float32], tokens: list[int], sampling: Sampling,
                  positions: list[int]) -> list[int]:
    """Speculative verification, the last stage's OUTPUT_KIND_VERIFIED
    (worker/service/speculation/draft_verify.cpp): `rows[i]` are the logits after `tokens[i]` (at
    `positions[i]`); each row is sampled as `sample` would, and the samples are kept up
    to and including the first that is not the next draft `tokens[i + 1]`.

    For a draft d this accepts with probability p(d) (the sample is d exactly that
    often) and on rejection yields a token drawn from p with d removed, renormalised: the
    standard accept/reject rule for a deterministic draft, so speculation leaves the
    distribution - with positional draws, the very tokens - of plain decoding unchanged.
    """
    out: list[int] = []
    for i, position in enumerate(positions):
        token = sample(rows[i], sampling, position)
        out.append(token)
        if i + 1 >= len(tokens) or token != tokens[i + 1]:
            break
    return out
