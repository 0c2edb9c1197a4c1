"""When a crashed local worker may start again: exponential backoff as the kubelet's,
and a budget of restarts per window, after which `meshnet up` gives up instead of
restarting a stage that cannot run for ever."""

from __future__ import annotations

from collections import defaultdict, deque

BACKOFF_CAP_S = 30.0
WINDOW_S = 600.0
DEFAULT_BUDGET = 5


class RestartPolicy:
    """Per stage: crash times within the window, and when it may start again."""

    def __init__(self, budget: int = DEFAULT_BUDGET, window: float = WINDOW_S) -> None:
        self.budget = budget
        self.window = window
        self.total: dict[str, int] = defaultdict(int)  # restarts so far, as the kubelet counts
        self._recent: dict[str, deque[float]] = defaultdict(deque)
        self._not_before: dict[str, float] = {}

    def crashed(self, stage: str, now: float) -> float:
        """Records a crash; the seconds until the stage may start again."""
        self.total[stage] += 1
        recent = self._recent[stage]
        recent.append(now)
        while recent and recent[0] <= now - self.window:
            recent.popleft()
        delay = min(BACKOFF_CAP_S, 2.0 ** (len(recent) - 1))
        self._not_before[stage] = now + delay
        return delay

    def exhausted(self, stage: str) -> bool:
        """More crashes within the window than the budget allows restarts."""
        return len(self._recent[stage]) > self.budget

    def may_start(self, stage: str, now: float) -> bool:
        return not self.exhausted(stage) and now >= self._not_before.get(stage, 0.0)

    def crashes_in_window(self, stage: str) -> int:
        return len(self._recent[stage])
