"""Real processes behind the local cluster's fake pods.

KWOK marks pods Running but runs nothing. For namespaces named `fleet-*` the pod runner starts each pod's `kvpilot ...` containers as real processes inside a network
namespace that owns the pod's IP (KWOK allocates pod IPs from 198.18.0.0/16, which a host bridge
routes), keeps the pod's Ready condition honest from its readiness probes, and lists the pods'
metrics ports for Prometheus (file_sd). See docs/dev/local-fleet.md.
"""

# The name (not a label) opts a namespace in: KWOK's pod stage (kwok_stages.yaml) sees only the pod,
# and must leave Ready to the runner for exactly these namespaces' pods.
RUN_PODS_PREFIX = "fleet-"
