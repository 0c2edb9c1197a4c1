"""A stage's layer range, the one typed form from the plan to the worker's command line."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerRange:
    """The half-open range [begin, end) of a model's layers; `end` None: to the last.
    Not checked here: the CRD checks a route's ranges, and the worker's one parser
    (layer_range) refuses what it cannot serve, with the reason."""

    begin: int
    end: int | None = None

    def __str__(self) -> str:
        """The worker's --layers form, BEGIN:END (BEGIN: to the last layer)."""
        return f"{self.begin}:{'' if self.end is None else self.end}"
