"""A replica scaled away from a `meshnet up` route drains, as a cluster's does
(meshnet.reconcile.route.rollout): it leaves the route registry at once, so the gateway
sends it no new session, and its workers stop once its stages hold no session, or when
spec.rollout.drainSeconds are over (a session still running then is moved by the gateway
to a replica that stays)."""

from __future__ import annotations

from collections.abc import Sequence

from meshnet.errors import MeshnetError
from meshnet.route import StageClient

# The gateway reads the registry at every probe (2 s): until it has, it may still send
# the replica a session, so its stages' word that they hold none counts only after this.
GATEWAY_GRACE_SECONDS = 3.0
ASK_TIMEOUT_SECONDS = 1.0  # for each stage's GetCapacity


def drain_ended(draining_for: float, drain_seconds: float,
                endpoints: Sequence[str]) -> str | None:
    """Why a replica draining for `draining_for` seconds may stop now, with its stages at
    `endpoints`; None while it runs on."""
    if draining_for >= drain_seconds:
        return f"its {drain_seconds:g}s drain ended"
    if draining_for >= GATEWAY_GRACE_SECONDS and not holds_sessions(endpoints):
        return "its sessions ended"
    return None


def holds_sessions(endpoints: Sequence[str]) -> bool:
    """Whether a stage holds a session (GetCapacity); one that does not answer counts as
    holding one, so a replica goes early only on every stage's word."""
    for endpoint in endpoints:
        client = StageClient(endpoint, timeout=ASK_TIMEOUT_SECONDS)
        try:
            if client.capacity().active_sessions > 0:
                return True
        except (MeshnetError, OSError):
            return True
        finally:
            client.close()
    return False
