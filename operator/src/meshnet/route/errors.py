"""Exceptions of the route driver.

MeshnetError
└── RouteError          the route cannot serve the request
    ├── RouteRefused    the handshake found an inconsistent route (`problems` lists why)
    ├── PromptTooLong   the prompt does not fit the route's context
    ├── StageError      a stage answered an error (`reason` from the protocol's set)
    └── RecoveryFailed  CACHE_MISS / EPOCH_MISMATCH / restarts kept coming back
"""

from __future__ import annotations

from collections.abc import Mapping

from meshnet.errors import MeshnetError


class RouteError(MeshnetError):
    """The route cannot serve the request."""


class RouteRefused(RouteError):
    """GetInfo on the stages shows a route that must not be used; `reason` types it."""

    def __init__(self, problems: list[str], reason: str = "RouteMismatch") -> None:
        super().__init__("route refused:\n  - " + "\n  - ".join(problems))
        self.problems = problems
        self.reason = reason


class PromptTooLong(RouteError):
    """The prompt (with the completion asked for, when `max_tokens` is given) does not fit
    the per-session context: a request error, never the route's failure."""

    def __init__(self, prompt_tokens: int | None, n_ctx: int,
                 max_tokens: int | None = None) -> None:
        """`prompt_tokens` None: a stage refused the text uncounted (from its bytes)."""
        if prompt_tokens is None:
            message = (f"the prompt is more tokens than the route's context holds ({n_ctx}):"
                       " shorten the prompt")
        elif max_tokens is None:
            message = (f"the prompt has {prompt_tokens} tokens, the route's context holds "
                       f"{n_ctx}: shorten the prompt")
        else:
            message = (f"the prompt has {prompt_tokens} tokens and max_tokens is "
                       f"{max_tokens}, the route's context holds {n_ctx} (at most "
                       f"{max(0, n_ctx - prompt_tokens + 1)} tokens after this prompt): "
                       "shorten the prompt or ask for fewer tokens")
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
        self.max_tokens = max_tokens


# Reasons after which the session's state on some stage is gone or stale.
RECOVERABLE_REASONS = frozenset({"CACHE_MISS", "EPOCH_MISMATCH", "ENGINE_FAILURE",
                                 "CHAIN_MISMATCH"})  # a stage of the chain restarted: refresh
# Transport answers meaning the worker is (re)starting or unreachable for now.
TRANSIENT_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"})


class StageError(RouteError):
    """A stage answered a gRPC error; `reason` is its ErrorInfo reason ("" if none)."""

    def __init__(
        self, endpoint: str, code: str, reason: str, message: str,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        label = reason or code
        super().__init__(f"stage {endpoint}: {label}: {message}")
        self.endpoint = endpoint
        self.code = code
        self.reason = reason
        self.detail = message
        self.metadata = dict(metadata or {})

    @property
    def recoverable(self) -> bool:
        """A re-prefill under a new session can go on: the stage lost or outdated the
        session's state, or is (re)starting."""
        return self.reason in RECOVERABLE_REASONS or self.code in TRANSIENT_CODES


class RecoveryFailed(RouteError):
    """The route kept losing the session's state; gave up after the allowed recoveries."""
