"""The ShardRoute operator: kopf handlers over `meshnet.reconcile`, with the Kubernetes
backend (`executor`, `kube`), settings from the environment and Prometheus metrics."""

from meshnet.operator.run import run
from meshnet.operator.settings import OperatorSettings

__all__ = ["OperatorSettings", "run"]
