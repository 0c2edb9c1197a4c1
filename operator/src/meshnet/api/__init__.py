"""Typed models of the meshnet.dev/v1alpha1 custom resources and their CRDs.

    ModelArtifact   an exact split-GGUF model, provisioned and verified (short name ma)
    ShardRoute      a pipeline of layer ranges serving one artifact (short name sr)
"""

from meshnet.api.common import API_VERSION, GROUP, VERSION, Condition
from meshnet.api.modelartifact import (
    ArtifactFile,
    ModelArtifact,
    ModelArtifactSpec,
    ModelArtifactStatus,
)
from meshnet.api.shardroute import (
    LayerRange,
    Recipe,
    ShardRoute,
    ShardRouteSpec,
    ShardRouteStatus,
    Stage,
    StageStatus,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "VERSION",
    "ArtifactFile",
    "Condition",
    "LayerRange",
    "ModelArtifact",
    "ModelArtifactSpec",
    "ModelArtifactStatus",
    "Recipe",
    "ShardRoute",
    "ShardRouteSpec",
    "ShardRouteStatus",
    "Stage",
    "StageStatus",
]
