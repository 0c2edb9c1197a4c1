"""The text of a generation as it streams: given the whole text decoded so far, what may
be shown now, and where a stop string ends it (pure)."""

from __future__ import annotations


def _pending_stop_prefix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that a stop string could still grow from."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


class TextStream:
    """Feed it the whole text after each token; it answers the part that became safe to
    show: never the start of a possible stop string (a character cut between tokens the
    stage's Detokenize holds back itself)."""

    def __init__(self, stops: tuple[str, ...] = ()) -> None:
        self.stops = stops
        self.shown = ""
        self.stopped = False  # a stop string was found: the generation is over

    def update(self, text: str, final: bool = False) -> str:
        if self.stopped:
            return ""
        start = max(0, len(self.shown) - max((len(s) for s in self.stops), default=0))
        hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            end = min(hits)
        elif final:
            end = len(text)
        else:
            end = len(text) - _pending_stop_prefix(text, self.stops)
        end = max(end, len(self.shown))
        delta = text[len(self.shown):end]
        self.shown += delta
        return delta
