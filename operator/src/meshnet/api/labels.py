"""Label and annotation keys the operator puts on its children (and nodes)."""

from __future__ import annotations

from meshnet.api.common import GROUP

ROUTE = f"{GROUP}/route"
STAGE = f"{GROUP}/stage"
EPOCH = f"{GROUP}/epoch"
# The replica (pipeline) a stage pod and its headless Service belong to: 0, 1, ...
REPLICA = f"{GROUP}/replica"
DIGEST = f"{GROUP}/route-digest"  # first 16 hex digits: label values stop at 63 characters
TEMPLATE = f"{GROUP}/template-hash"
# A route's gateway Deployment, its pods and Service carry GATEWAY (the route's name), not
# ROUTE: the stages' headless Service selects ROUTE and must not pick gateway pods.
GATEWAY = f"{GROUP}/gateway"
# A route's certification Jobs and their pods (not ROUTE: the stage-pod index skips them).
CERTIFY_ROUTE = f"{GROUP}/certify-route"
ROUTE_DIGEST_ANNOTATION = f"{GROUP}/route-digest"
# On the stage pods of a pipeline being retired (replaced by a new epoch or scaled away):
# when the gateway stopped sending it new sessions (RFC 3339); it goes spec.rollout
# .drainSeconds later.
DRAINING_ANNOTATION = f"{GROUP}/draining-since"
MANAGED_BY = "app.kubernetes.io/managed-by"
OPERATOR_NAME = "meshnet-operator"
FIELD_MANAGER = "meshnet-operator"

# A ModelArtifact's provisioning Jobs, their pods and spec ConfigMaps carry ARTIFACT (a
# label value: the name, shortened with a hash past 63 characters) and the annotations
# (exact values: an artifact or node name may be longer than a label value allows).
ARTIFACT = f"{GROUP}/artifact"
ARTIFACT_ANNOTATION = f"{GROUP}/artifact"
NODE_ANNOTATION = f"{GROUP}/node"
MANIFEST_ANNOTATION = f"{GROUP}/manifest-digest"
# On a full re-hash Job of a copy: the round (the time of the check it follows).
REHASH_ANNOTATION = f"{GROUP}/rehash-round"
# Set by the Job controller on the pods of a Job.
JOB_NAME = "batch.kubernetes.io/job-name"

# Nodes whose host-path copy of an artifact is verified carry this label; stage pods of
# host-path artifacts require it so they are only scheduled where the files really are.
ARTIFACT_NODE_PREFIX = f"artifact.{GROUP}/"
VERIFIED = "verified"


def artifact_node_label(manifest_digest: str) -> str:
    """The node label key for one artifact copy (by content: same bytes, same label)."""
    return ARTIFACT_NODE_PREFIX + manifest_digest[:32]
