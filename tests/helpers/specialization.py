"""Record the Triton specialisation key of every kernel launch run by the interpreter (TRITON_INTERPRET=1).

Triton compiles one variant per key: constexpr values, and for runtime arguments what its launcher's
`native_specialize_impl` returns (dtype; an integer's being 1 or divisible by 16; a pointer's 16-byte
alignment), less what the kernel's `do_not_specialize` / `do_not_specialize_on_alignment` exclude. A
key first seen in the middle of serving is a compile on a GPU. Used by tests/kernels/test_specialization.py
and bench/specialization_probe.py.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


def _runtime_spec(value: object, specialize: bool, align: bool) -> object:
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    try:
        return native_specialize_impl(BaseBackend, value, False, specialize, align)
    except TypeError:  # a value Triton does not specialise on (a dtype passed through): keyed by itself
        return repr(value)


@dataclass
class Recorder:
    """Keys seen per kernel name; `new` lists (kernel, changed arguments) since the last `take_new()`."""

    seen: dict[str, set[tuple]] = field(default_factory=lambda: defaultdict(set))
    new: list[tuple[str, list[str]]] = field(default_factory=list)

    def record(self, fn, args: tuple, kwargs: dict) -> None:  # type: ignore[no-untyped-def]
        name = getattr(fn.fn, "__name__", "kernel")
        plain = set(fn.kwargs.get("do_not_specialize") or ())
        unaligned = set(fn.kwargs.get("do_not_specialize_on_alignment") or ())
        params = inspect.signature(fn.fn).parameters
        values = dict(zip(fn.arg_names, args, strict=False)) | {k: v for k, v in kwargs.items() if k in params}
        key = tuple(
            (n, repr(v) if "constexpr" in str(params[n].annotation) else _runtime_spec(v, n not in plain, n not in unaligned))
            for n, v in values.items()
        )  # fmt: skip
        if key in self.seen[name]:
            return
        changed: list[str] = []
        if self.seen[name]:  # the arguments that differ from the closest key seen before
            closest = min(self.seen[name], key=lambda k: sum(a != b for a, b in zip(k, key, strict=False)))
            changed = [f"{a[0]}: {a[1]} -> {b[1]}" for a, b in zip(closest, key, strict=False) if a != b]
        self.seen[name].add(key)
        self.new.append((name, changed))

    def take_new(self) -> list[tuple[str, list[str]]]:
        new, self.new = self.new, []
        return new


@contextmanager
def recording() -> Iterator[Recorder]:
    """Record every interpreted kernel launch inside the block (needs TRITON_INTERPRET=1 before triton's import)."""
    from triton.runtime.interpreter import InterpretedFunction

    recorder = Recorder()
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):  # type: ignore[no-untyped-def]
        recorder.record(self, args, kwargs)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    try:
        yield recorder
    finally:
        InterpretedFunction.run = original


__all__ = ["Recorder", "recording"]
