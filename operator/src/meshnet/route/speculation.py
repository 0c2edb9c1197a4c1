"""Exact speculative decoding through the route, driven by the route driver, for routes
whose first stage cannot decode by itself (the hub). A route that can loops instead, and
its first stage drafts and verifies in the loop (ForwardRequest.loop_drafts, the same
rules as here), with no round trip to the driver per step.

Each step carries [last token, d1 .. dk] (drafts from prompt lookup, meshnet.route.drafts)
through every stage at once - the hub calls each stage in turn, the chain only the first -
and the last stage verifies it (OUTPUT_KIND_VERIFIED): it samples every row as a plain
decode step would and answers the accepted drafts plus one more token. The stages then
hold the rejected drafts' positions too; the next step carries `discard_from` so that
every stage drops them before it runs. The tokens are those of plain decoding: greedy
argmax per row, and sampled rows drawn with the same positional draw (the standard
accept/reject rule for a deterministic draft, docs/architecture.md); exact as long as a
row computes in a step of k + 1 rows what it computes alone (the CPU lane's batch
invariant widths, drafts.MAX_DRAFT).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from meshnet.route.drafts import DraftLength, PromptLookup
from meshnet.route.errors import StageError
from meshnet.route.proto import pb
from meshnet.route.sampling import verify_drafts

if TYPE_CHECKING:
    from meshnet.route.session import Session


def accepted_tokens(session: Session, response: pb.ForwardResponse, tokens: list[int],
                    n_past: int) -> list[int]:
    """The accepted drafts and the token after them, from the last stage's answer to a
    verification step of `tokens` at `n_past`: as it verified them, or verified here from
    every row's logits (the same rule)."""
    if response.sampled_tokens:
        return [int(t) for t in response.sampled_tokens]
    rows = np.asarray([row.logits for row in response.rows], dtype=np.float32)
    return verify_drafts(rows, tokens, session.sampling, list(range(n_past, n_past + len(tokens))))


def speculated(session: Session, token: int, count: int, stop_ids: set[int],
               lookup: PromptLookup, length: DraftLength) -> Iterator[int]:
    """Up to `count` tokens after `token` (stopping after a stop id), in verification
    steps; `lookup` holds the context (prompt and tokens so far, `token` included)."""
    produced = 0
    held, held_by = len(session.history), session.session_id  # positions the stages hold
    while produced < count:
        route = session.route
        if session.session_id != held_by:  # recovered: a new session holds the history only
            held, held_by = len(session.history), session.session_id
        n_past = len(session.history)
        room = min(count - produced - 1, route.n_ctx - n_past - 1, length.wanted())
        draft = lookup.draft(room)
        step = [token, *draft]
        try:
            out = session.walk.verify(session, step, discard=held > n_past)
        except StageError as exc:
            session.recover(exc)
            out = [session.steps_with_recovery([*session.forget_history(), [token]])]
            draft = []
            held, held_by = len(session.history), session.session_id
        else:
            accepted = len(out) - 1
            session.remember(step[:accepted + 1])
            held = n_past + len(step)
            session.count_drafts(len(draft), accepted)
            length.verified(len(draft), accepted)
        if not draft:
            length.decoded_plainly(len(out))
        for sampled in out[:count - produced]:
            produced += 1
            lookup.extend([sampled])
            token = sampled
            yield sampled
            if sampled in stop_ids:
                return

