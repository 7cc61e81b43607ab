"""Fake GPU nodes for KWOK: pure builders of Node objects (dicts)."""

from __future__ import annotations

from dataclasses import dataclass

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB, as NVIDIA's GPU feature discovery writes it
COUNT_LABEL = "nvidia.com/gpu.count"


@dataclass(frozen=True)
class GpuNodeSpec:
    """What one fake node offers; defaults describe an 8 x H200 (141 GB) server."""

    gpus: int = 8
    gpu_product: str = "NVIDIA-H200"
    gpu_memory_mib: int = 143771
    cpu: str = "96"
    memory: str = "1536Gi"
    pods: str = "110"


def node_name(index: int) -> str:
    return f"kvpilot-gpu-{index}"


def gpu_node(name: str, spec: GpuNodeSpec = GpuNodeSpec()) -> dict:
    """A Node that KWOK manages (by annotation) with `spec.gpus` allocatable `nvidia.com/gpu`."""
    resources = {"cpu": spec.cpu, "memory": spec.memory, "pods": spec.pods, GPU_RESOURCE: str(spec.gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE, "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                PRODUCT_LABEL: spec.gpu_product,
                MEMORY_LABEL: str(spec.gpu_memory_mib),
                COUNT_LABEL: str(spec.gpus),
            },
        },
        "spec": {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }
