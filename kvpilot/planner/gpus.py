"""GPU products by their `nvidia.com/gpu.product` label, with the memory the driver reports."""

from __future__ import annotations

from dataclasses import dataclass

from kvpilot.planner.errors import PlannerError

MIB = 1 << 20
GIB = 1 << 30
DEFAULT_CUDA_CONTEXT_BYTES = 1 * GIB  # CUDA context, cuBLAS/Triton workspaces, NCCL: per GPU


@dataclass(frozen=True)
class GpuSpec:
    """One GPU product: the label GPU feature discovery puts on nodes and its usable memory."""

    product: str  # the node label value, e.g. NVIDIA-H200
    memory_bytes: int  # total memory as nvidia-smi reports it
    marketing_name: str = ""
    cuda_context_bytes: int = DEFAULT_CUDA_CONTEXT_BYTES


# memory.total as nvidia-smi prints it (MiB), not the marketing GB.
_TABLE = (
    GpuSpec("NVIDIA-H200", 143771 * MIB, "H200 141 GB"),
    GpuSpec("NVIDIA-H100-80GB-HBM3", 81559 * MIB, "H100 SXM 80 GB"),
    GpuSpec("NVIDIA-H100-PCIe", 81559 * MIB, "H100 PCIe 80 GB"),
    GpuSpec("NVIDIA-A100-SXM4-80GB", 81920 * MIB, "A100 80 GB"),
    GpuSpec("NVIDIA-A100-SXM4-40GB", 40960 * MIB, "A100 40 GB"),
    GpuSpec("NVIDIA-A100-PCIE-40GB", 40960 * MIB, "A100 PCIe 40 GB"),
    GpuSpec("NVIDIA-L40S", 46068 * MIB, "L40S 48 GB"),
    GpuSpec("NVIDIA-A10G", 23028 * MIB, "A10G 24 GB"),
    GpuSpec("NVIDIA-L4", 23034 * MIB, "L4 24 GB"),
    GpuSpec("NVIDIA-GeForce-RTX-4090", 24564 * MIB, "RTX 4090 24 GB"),
    GpuSpec("Tesla-T4", 15360 * MIB, "T4 16 GB"),
)

_ALIASES = {
    "h200": "NVIDIA-H200", "h100": "NVIDIA-H100-80GB-HBM3", "h100-80gb": "NVIDIA-H100-80GB-HBM3",
    "a100": "NVIDIA-A100-SXM4-80GB", "a100-80gb": "NVIDIA-A100-SXM4-80GB",
    "a100-40gb": "NVIDIA-A100-SXM4-40GB", "l40s": "NVIDIA-L40S", "a10g": "NVIDIA-A10G",
    "l4": "NVIDIA-L4", "rtx4090": "NVIDIA-GeForce-RTX-4090", "t4": "Tesla-T4",
    # GKE's cloud.google.com/gke-accelerator values, less the "nvidia-" prefix
    "h200-141gb": "NVIDIA-H200", "h100-mega-80gb": "NVIDIA-H100-80GB-HBM3", "tesla-a100": "NVIDIA-A100-SXM4-40GB",
    "tesla-t4": "Tesla-T4",
}

GPU_PRODUCTS: dict[str, GpuSpec] = {g.product: g for g in _TABLE}


def gpu_spec(product: str) -> GpuSpec:
    """The GPU for a node-label value (`NVIDIA-H200`) or a short alias (`h200`), case-insensitive."""
    key = product.strip()
    by_lower = {name.lower(): spec for name, spec in GPU_PRODUCTS.items()}
    if key.lower() in by_lower:
        return by_lower[key.lower()]
    alias = _ALIASES.get(key.lower().removeprefix("nvidia-").replace(" ", "-"))
    if alias:
        return GPU_PRODUCTS[alias]
    raise PlannerError(
        f"GPU product {product!r} is not in the planner's table; use one of {', '.join(GPU_PRODUCTS)} "
        "(or pass the memory yourself)"
    )
