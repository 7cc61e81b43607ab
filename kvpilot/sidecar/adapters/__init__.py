"""Adapters that map other engines' /metrics pages onto kvpilot's schema, by engine kind."""

from __future__ import annotations

from kvpilot.sidecar.adapters.base import Adapter, AdapterError, Mapping, read_page
from kvpilot.sidecar.adapters.sglang import SGLANG
from kvpilot.sidecar.adapters.vllm import VLLM

ADAPTERS: dict[str, Adapter] = {adapter.kind: adapter for adapter in (VLLM, SGLANG)}

__all__ = ["ADAPTERS", "Adapter", "AdapterError", "Mapping", "read_page"]
