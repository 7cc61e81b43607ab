"""spec.autoscaling: an HPA per track, and the operator leaving spec.replicas to it (docs/operator.md).

spec.py (AutoscalingSpec), hpa.py (the HPA builder), policy.py (bounds, the replicas handoff),
tracks.py (applying both). Nothing is imported here: kvpilot.operator.spec imports spec.py, and
the builders it would pull in import kvpilot.operator.spec back.
"""
