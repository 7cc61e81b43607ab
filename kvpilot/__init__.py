"""kvpilot: LLM inference fleets on Kubernetes with the KV cache as the first-class concern.

`from kvpilot import LLM, SamplingParams` is the offline engine API; it is loaded on first use, so
importing `kvpilot.operator` or `kvpilot.sidecar` never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvpilot.engine.llm import LLM
    from kvpilot.engine.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("LLM", "SamplingParams"):
        import kvpilot.engine

        return getattr(kvpilot.engine, name)
    raise AttributeError(f"module 'kvpilot' has no attribute {name!r}")
