"""Model artifacts: describe, provision and verify an exact split-GGUF model.

Public surface:
    load_artifact(path) -> Artifact                  the ModelArtifact fields used here
    build_manifest(paths, meters) -> Manifest         `meshnet artifact manifest`
    pull(artifact, dest, source, meters) -> PullSummary   `meshnet artifact pull`
    verify_folder(folder, artifact, meters) -> VerifyReport  `meshnet artifact verify`
    stage_footprint(facts, begin, end) -> int         weight bytes of a layer range

Status derived from what a pull reported is planning: meshnet.reconcile.artifact.status.
"""

from meshnet.artifacts.facts import ModelFacts, stage_footprint
from meshnet.artifacts.manifest import Manifest, build_manifest
from meshnet.artifacts.pull import PullSummary, pull
from meshnet.artifacts.spec import Artifact, load_artifact, parse_artifact
from meshnet.artifacts.verify import VerifyReport, verify_folder

__all__ = [
    "Artifact",
    "Manifest",
    "ModelFacts",
    "PullSummary",
    "VerifyReport",
    "build_manifest",
    "load_artifact",
    "parse_artifact",
    "pull",
    "stage_footprint",
    "verify_folder",
]
