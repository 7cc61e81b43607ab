"""Kopf handlers, one cause per module; importing this package registers them all."""

from kvpilot.operator.handlers import deployments, reconcile, startup

__all__ = ["deployments", "reconcile", "startup"]
