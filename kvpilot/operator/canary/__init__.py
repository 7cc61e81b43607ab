"""The rollout controller: observes an InferenceService's world, runs the pure state machine
(kvpilot.operator.rollout) and applies its actions through the Kube client, the Router and the
MetricProvider. Kopf-free, so tests can drive it against a real API server without kopf."""
