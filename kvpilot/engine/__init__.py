"""kvpilot's inference engine. Importing this package imports no torch; `LLM` and the submodules do.

`from kvpilot.engine import LLM, SamplingParams` (also `from kvpilot import ...`) loads them on first
use, so the sidecar and the operator can import the torch-free parts (`metrics.stats_contract`,
`config`) without pulling in torch. The layers, from ground up, are in docs/dev/architecture.md.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvpilot.engine.config import EngineConfig
    from kvpilot.engine.llm import LLM
    from kvpilot.engine.llm_engine import LLMEngine, RequestOutput
    from kvpilot.engine.sampling_params import SamplingParams

PUBLIC = {
    "LLM": "kvpilot.engine.llm",
    "SamplingParams": "kvpilot.engine.sampling_params",
    "LLMEngine": "kvpilot.engine.llm_engine",
    "RequestOutput": "kvpilot.engine.llm_engine",
    "EngineConfig": "kvpilot.engine.config",
}
__all__ = ["LLM", "EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name not in PUBLIC:
        raise AttributeError(f"module 'kvpilot.engine' has no attribute {name!r}; it exports {__all__}")
    return getattr(import_module(PUBLIC[name]), name)
