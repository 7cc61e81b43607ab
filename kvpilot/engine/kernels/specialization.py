"""Kernels launched with per-step metadata must not be specialised on it, or serving compiles mid-step.

Triton compiles one variant of a kernel per *specialisation key*: beside constexprs and dtypes, every
integer argument is specialised on being 1 and on being divisible by 16, and every pointer on 16-byte
alignment. The engine's per-step metadata moves those from step to step: the number of tokens stored
(1 when one sequence decodes alone), and index tensors (positions, slot mappings, block tables,
context lengths, cumulative lengths) that are slices of persistent buffers at offsets that are not
always a multiple of 16 bytes. On the H200 an eager engine compiled 32 variants in its first decode
round, one step taking 457 ms (docs/benchmarks.md, "The eager outlier"); bench/specialization_probe.py
finds the arguments on the CPU.

Those pointers are read one element per program or gathered (`offs_n // PAGE`), never as vectors, so
their alignment buys nothing; the counts only bound masks. `step_kernel` is `triton.jit` without
specialisation on the arguments of those names that a kernel has.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import triton

# pointers into per-step index tensors (read element-wise or gathered)
STEP_POINTERS = (
    "pos_ptr", "slot_mapping_ptr", "slot_ptr", "block_tables_ptr", "block_ids_ptr", "context_lens_ptr",
    "cu_seqlens_q_ptr", "cu_ptr",
)  # fmt: skip
# integers that count this step's rows
STEP_COUNTS = ("num_tokens",)

_HAS_ALIGNMENT_OPTION = "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters


def step_options(fn: Callable[..., Any]) -> dict[str, list[str]]:
    """The `triton.jit` options that keep `fn`'s per-step arguments out of its specialisation key."""
    names = inspect.signature(fn).parameters
    options = {"do_not_specialize": [n for n in STEP_COUNTS if n in names]}
    if _HAS_ALIGNMENT_OPTION:
        options["do_not_specialize_on_alignment"] = [n for n in STEP_POINTERS if n in names]
    return options


def step_kernel(fn: Callable[..., Any]) -> Any:
    """`@step_kernel` in place of `@triton.jit` for a kernel that takes per-step metadata."""
    return triton.jit(fn, **step_options(fn))
