"""The kinds of drafter a route's last stage hosts. The CRDs spell them MTP and DSpark (a
route's recipe.speculation.mode, an artifact's status.gguf.drafter.kind), the worker mtp and
dspark (--drafter, GetInfo's drafter.kind). Code compares kinds, never either spelling: a
spelling is parsed where it comes in and written where it goes out."""

from __future__ import annotations

import enum
from typing import Literal

# The CRDs' spelling of a drafter kind (an artifact's status.gguf.drafter.kind).
DrafterApiName = Literal["MTP", "DSpark"]


class DrafterKind(enum.Enum):
    """A drafter on the last stage; the value is the worker's spelling."""

    MTP = "mtp"  # the model's own multi-token-prediction (nextn) blocks
    DSPARK = "dspark"  # a DSpark drafter GGUF beside the model (its file of role Drafter)

    @property
    def api_name(self) -> DrafterApiName:
        """The CRDs' spelling: MTP, DSpark."""
        return _API_NAMES[self]

    @classmethod
    def from_api(cls, name: object) -> DrafterKind | None:
        """The kind the CRDs' `name` spells; None for any other value (speculation modes
        without a stage drafter: Disabled, Lookup)."""
        return next((kind for kind, api in _API_NAMES.items() if api == name), None)

    @classmethod
    def from_worker(cls, name: str) -> DrafterKind | None:
        """The kind a worker's `name` spells (GetInfo's drafter.kind); None for "" (it hosts
        none) and for a kind this release does not know."""
        return next((kind for kind in cls if kind.value == name), None)


_API_NAMES: dict[DrafterKind, DrafterApiName] = {DrafterKind.MTP: "MTP",
                                                  DrafterKind.DSPARK: "DSpark"}
