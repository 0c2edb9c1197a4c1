"""What every resource we own is observed as, routes and artifacts alike: who it is, its
spec parsed (or why it does not parse), its status as written, whether it is going away."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

SpecT = TypeVar("SpecT", bound=BaseModel)


@dataclass(frozen=True)
class ObservedResource(Generic[SpecT]):
    """The resource itself; spec is None when it does not parse (spec_errors say why)."""

    name: str
    namespace: str
    uid: str
    generation: int | None
    spec: SpecT | None
    spec_errors: tuple[str, ...] = ()
    status: Mapping[str, Any] = field(default_factory=dict)
    deleting: bool = False


def observe_resource(body: Mapping[str, Any], spec_type: type[SpecT]) -> ObservedResource[SpecT]:
    meta = body.get("metadata") or {}
    spec: SpecT | None = None
    errors: tuple[str, ...] = ()
    try:
        spec = spec_type.model_validate(body.get("spec") or {})
    except ValidationError as exc:
        errors = tuple(
            f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
    return ObservedResource(
        name=meta.get("name", ""), namespace=meta.get("namespace", "default"),
        uid=meta.get("uid", ""), generation=meta.get("generation"), spec=spec,
        spec_errors=errors, status=body.get("status") or {},
        deleting=bool(meta.get("deletionTimestamp")),
    )
