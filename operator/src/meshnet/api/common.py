"""Building blocks shared by the custom resources: the camelCase base model, conditions,
quantities and the CEL rule helper that the CRD generator copies into the schemas."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue
from pydantic.alias_generators import to_camel

GROUP = "meshnet.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# Upper bounds keep every CEL rule inside the API server's static cost budget.
MAX_NAME = 63
MAX_PATH = 4096
MAX_STAGES = 64
MAX_FILES = 256

# How a route's steps go through its stages (meshnet.route.driver): each in turn from the
# driver, relayed stage to stage, or relayed with the last stage's tokens sent to the first.
Topology = Literal["hub", "chain", "ring"]
# recipe.batching: Exact steps sessions together only where it computes each as alone;
# Throughput batches as upstream does, so a session's tokens may depend on the load.
Batching = Literal["Exact", "Throughput"]

# A Kubernetes quantity ("2", "8Gi", 1): the API server accepts integers or strings.
Quantity = int | Annotated[str, Field(max_length=64)]


def rule(expr: str, message: str, **extra: str) -> dict[str, str]:
    """One `x-kubernetes-validations` entry (extra: fieldPath, reason)."""
    return {"rule": expr, "message": message, **extra}


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    """Schema extras carrying CEL rules into the generated CRD."""
    return {"x-kubernetes-validations": list(rules)}


def no_home(field: str = "path") -> dict[str, str]:
    """CEL rule: a host path that is absolute, normalised and never under /home."""
    return rule(
        f"self.{field}.matches('^(/[^/]+)+$') && !self.{field}.matches('(^|/)[.][.]?(/|$)')"
        f" && self.{field} != '/home' && !self.{field}.startsWith('/home/')",
        f"{field} must be an absolute, normalised host path outside /home"
        " (model artifacts are never placed under /home)",
    )


class ApiModel(BaseModel):
    """Base of every resource part: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class StatusModel(ApiModel):
    """Base of status parts: written by controllers, so unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")


# A status's conditions are a map keyed by type: each writer's server-side merges touch only
# its own entries (metav1.Condition lists in core APIs are declared the same way).
CONDITIONS_LIST: dict[str, JsonValue] = {"x-kubernetes-list-type": "map",
                                         "x-kubernetes-list-map-keys": ["type"]}


class Condition(StatusModel):
    """The standard Kubernetes condition (metav1.Condition)."""

    type: str = Field(max_length=316, description="Condition type, e.g. Ready.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(max_length=1024, description="CamelCase reason for the last transition.")
    message: str = Field(default="", max_length=32768, description="Human-readable details.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation this condition was computed from."
    )
    last_transition_time: str | None = Field(
        default=None, description="When the status last changed (RFC 3339)."
    )


class LocalObjectReference(ApiModel):
    """A reference to an object in the same namespace."""

    name: str = Field(min_length=1, max_length=253, description="Name of the object.")
