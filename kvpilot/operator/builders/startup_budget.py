"""How long a new engine pod may take before its Deployment counts as stalled (pure).

Kubernetes marks a Deployment `ProgressDeadlineExceeded` after `progressDeadlineSeconds` (600 s
by default) without a new pod becoming available, and the operator reports that as Degraded. An
engine is allowed far longer by its startup probe (weights, warm-up and Triton autotuning before
`/health` answers), and a 70B checkpoint read from a network volume can need most of it: the
deadline must cover the whole start, or a healthy slow start is reported as a failure.
"""

from __future__ import annotations

from kvpilot.planner import CapacityPlan

WEIGHT_READ_BYTES_PER_S = 200e6  # a conservative read rate from a network volume (PVC, NFS)
SCHEDULING_AND_PULL_S = 600  # node scale-up, the image pull, volume attach, before the probe starts
ROUND_S = 60


def weights_read_s(plan: CapacityPlan) -> int:
    """Seconds to read the replica's weights at WEIGHT_READ_BYTES_PER_S."""
    return int(plan.weights_bytes / WEIGHT_READ_BYTES_PER_S)


def progress_deadline_seconds(plan: CapacityPlan, startup_probe_s: int) -> int:
    """The startup probe's budget (or the weights' read time, if longer) plus scheduling and the image
    pull, rounded up to a minute: never below what the probe itself allows a pod."""
    budget = max(startup_probe_s, weights_read_s(plan)) + SCHEDULING_AND_PULL_S
    return -(-budget // ROUND_S) * ROUND_S
