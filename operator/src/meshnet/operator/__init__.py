"""The operator: kopf handlers over `meshnet.reconcile` for ShardRoutes and ModelArtifacts,
the per-route Tracker daemon (its passes planned by `meshnet.tracker.planner`), the
Kubernetes backend every plan goes through (`executor`, `kube`) and settings from the
environment. Its metrics live in `meshnet.metrics`, shared with `meshnet up`."""

from meshnet.operator.run import run
from meshnet.operator.settings import OperatorSettings

__all__ = ["OperatorSettings", "run"]
