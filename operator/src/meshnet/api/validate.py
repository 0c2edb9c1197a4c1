"""`meshnet validate`: meshnet.dev manifests checked offline with the CRDs' own rules
(schema + CEL) and the operator's cross-checks against artifacts in the same files."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from meshnet.api import modelartifact, shardroute
from meshnet.api.checks import Problem, drafter_problems, route_problems
from meshnet.api.common import API_VERSION
from meshnet.api.crd import crd_documents
from meshnet.api.modelartifact import GgufDrafter, GgufFacts
from meshnet.api.schemacheck import check


@dataclass(frozen=True, eq=False)
class Document:
    """One YAML document and where it came from (hashed by identity)."""

    source: str
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body.get("kind", ""))

    @property
    def key(self) -> tuple[str, str]:
        meta = self.body.get("metadata") or {}
        return str(meta.get("namespace") or "default"), str(meta.get("name") or "")

    def label(self) -> str:
        return f"{self.source}: {self.kind}/{self.key[1] or '<unnamed>'}"


def load(paths: Iterable[Path]) -> list[Document]:
    """Every mapping document of every file (YAML streams allowed)."""
    docs = []
    for path in paths:
        for i, body in enumerate(yaml.safe_load_all(path.read_text())):
            if body is not None:
                source = f"{path}#{i}" if i else str(path)
                docs.append(Document(source, body if isinstance(body, dict) else {"_": body}))
    return docs


def schemas() -> dict[str, dict[str, Any]]:
    """kind -> openAPIV3Schema of each CRD."""
    out = {}
    for crd in crd_documents().values():
        version = crd["spec"]["versions"][0]
        out[crd["spec"]["names"]["kind"]] = version["schema"]["openAPIV3Schema"]
    return out


def validate(docs: list[Document]) -> dict[Document, list[Problem]]:
    """Problems per meshnet.dev document (other kinds are not ours and are skipped)."""
    by_kind = schemas()
    results = {d: check(d.body, by_kind[d.kind]) for d in docs if _ours(d, by_kind)}
    artifacts = {d.key: d.body for d in results if d.kind == modelartifact.KIND and not results[d]}
    for doc, problems in results.items():
        if doc.kind == shardroute.KIND and not problems:
            problems += _cross_check(doc, artifacts)
    return results


def warnings(doc: Document) -> list[str]:
    """What a valid ShardRoute carries that was removed, each naming its replacement."""
    if doc.kind != shardroute.KIND:
        return []
    try:
        spec = shardroute.ShardRouteSpec.model_validate(doc.body.get("spec") or {})
    except ValidationError:
        return []
    return spec.recipe.removed_fields()


def _ours(doc: Document, by_kind: dict[str, Any]) -> bool:
    return doc.body.get("apiVersion") == API_VERSION and doc.kind in by_kind


def _cross_check(doc: Document, artifacts: dict[tuple[str, str], dict[str, Any]]) -> list[Problem]:
    spec = shardroute.ShardRouteSpec.model_validate(doc.body["spec"])
    artifact = artifacts.get((doc.key[0], spec.artifact_ref.name))
    if artifact is None:
        return route_problems(spec, None)
    return route_problems(spec, block_count(artifact)) + drafter_problems(
        spec, *artifact_drafter(artifact))


def block_count(artifact: dict[str, Any]) -> int | None:
    """The layers a route of the artifact must cover: the main layers the GGUF headers
    declare, else their block count, else the expectation's (which counts MTP blocks too:
    exact for every model without them)."""
    facts = (artifact.get("status") or {}).get("gguf") or {}
    expected = ((artifact.get("spec") or {}).get("expectations") or {}).get("blockCount")
    value = next((v for v in (facts.get("layers"), facts.get("blockCount"), expected)
                  if v is not None), None)
    return int(value) if value is not None else None


def artifact_drafter(artifact: dict[str, Any]) -> tuple[bool, GgufDrafter | None]:
    """(whether its headers were read, the drafter they show), from its status."""
    facts = (artifact.get("status") or {}).get("gguf")
    if not isinstance(facts, dict):
        return False, None
    return True, GgufFacts.model_validate(facts).drafter
