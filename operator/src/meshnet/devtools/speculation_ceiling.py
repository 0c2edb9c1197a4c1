"""The closed-form ceiling of a ring's pipelined speculation (the first stage's decode
loop, worker/service/speculation/loop_pipeline.cpp) when each drafted token holds with
probability p, alone: what bench/wan_bench.py --acceptance compares its measured rows with.

The peer's law: tokens/s = E[tokens committed per window] / L, L the ring's latency, with
E = (1 - p^(k+1)) / (1 - p) for k drafts a window, capped at (k + 1) / L. Our loop differs
in three ways, each in the form below:
- windows in flight: a window of k + 1 rows answers after L; the loop keeps up to
  D = min(windows, k + 1) in flight, drafted on the assumption that those before hold
  (our drafters need no target state, so the cap is D (k + 1) / L, not (k + 1) / L);
- the depth ramps: after a rejection one window (its first token the corrected one) is in
  flight; each window accepted whole lets one more in, so in each latency ("generation")
  g = 1, 2, 3 ... after a rejection d_g = min(D, 2^(g-1)) windows are in flight;
- a rejection voids every window behind it and starts the ramp over.
Generation g drafts n_g = d_g (k + 1) - known_g tokens, known_g = 1 where it starts from a
token already answered (g = 1, and any generation after one of a single window: the pipe
ran empty), else 0. A generation whose drafts all hold commits them and, where the next
starts from a known token, one more (the bonus row). Over a cycle from one rejection to
the next (renewal-reward), with N_g = n_1 + ... + n_g:
    E[tokens] = p / (1 - p) + 1 + sum_g p^N_g known_(g+1)   (drafts held, the correction,
                                                             the bonuses)
    E[generations] = sum_(g >= 1) p^N_(g-1)
    tokens/s = E[tokens] / (E[generations] L)
With D = 1 this is the peer's E / L exactly. It leaves out what the loop adds on purpose:
it keeps one window in flight while its measured acceptance is below 0.8
(loop_pipeline.cpp's pipelining_acceptance), which is `serial`'s E / L.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ceiling:
    tokens_per_latency: float  # E[tokens committed] per ring latency L
    cap_per_latency: float  # D (k + 1): every draft held

    def rate(self, latency_s: float) -> float:
        return self.tokens_per_latency / latency_s


def depth_limit(drafts: int, windows: int) -> int:
    """Windows the loop keeps in flight at most (loop_pipeline::depth)."""
    return max(1, min(windows, drafts + 1))


def pipelined(p: float, drafts: int, windows: int) -> Ceiling:
    """Tokens per ring latency of the pipelined loop at per-token acceptance `p`, `drafts`
    drafts a window and up to `windows` windows in flight (the module's form)."""
    if not 0 <= p <= 1 or drafts < 1 or windows < 1:
        raise ValueError(f"need 0 <= p <= 1, drafts >= 1, windows >= 1 (got {p}, {drafts}, "
                         f"{windows})")
    most = depth_limit(drafts, windows)
    cap = float(most * (drafts + 1))
    if p == 1:
        return Ceiling(cap, cap)

    def depth(g: int) -> int:
        return min(most, 1 << min(g - 1, 62))

    def known(g: int) -> bool:
        return g == 1 or depth(g - 1) == 1

    tokens = p / (1 - p) + 1
    generations = 0.0
    survive = 1.0  # p^N_(g-1): every draft so far held
    g = 1
    while not (depth(g) == most and (g == 1 or depth(g - 1) == most)):
        generations += survive
        survive *= p ** (depth(g) * (drafts + 1) - known(g))
        if known(g + 1):
            tokens += survive
        g += 1
    # From here every generation is alike (D windows, as known as the last): the rest of
    # both sums is geometric in its chance of holding whole.
    whole = p ** (most * (drafts + 1) - known(g))
    generations += survive / (1 - whole)
    if known(g + 1):
        tokens += survive * whole / (1 - whole)
    return Ceiling(tokens / generations, cap)


def serial(p: float, drafts: int) -> Ceiling:
    """One window in flight: the peer's E = (1 - p^(k+1)) / (1 - p) per latency."""
    return pipelined(p, drafts, 1)
