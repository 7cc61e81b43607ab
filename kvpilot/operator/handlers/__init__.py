"""Kopf handlers, one cause per module; importing this package registers them all.

`rollout_ticks` comes first: on a spec change its handler runs before the stable reconcile, so a
rollback flag moves traffic before anything slower happens.
"""

from kvpilot.operator.handlers import rollout_ticks  # noqa: I001  (registration order matters)
from kvpilot.operator.handlers import autoscaling, deployments, pods, reconcile, startup

__all__ = ["autoscaling", "deployments", "pods", "reconcile", "rollout_ticks", "startup"]
