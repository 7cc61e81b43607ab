"""Make Triton 3.6's interpreter (TRITON_INTERPRET=1) work with NumPy >= 2.4.

The interpreter holds every scalar as a 1-element array and turns it into a Python int with
`int(array)`, which NumPy 2.4 rejects for arrays with ndim > 0; loops such as
`for start in range(0, context_len, BLOCK_N)` then fail. Only the interpreter is patched (never
compiled kernels), and only when the installed interpreter still has the hook this relies on.
"""

from __future__ import annotations

import os


def _scalar_index(tensor) -> int:  # type: ignore[no-untyped-def]
    return int(tensor.handle.data.reshape(-1)[0])


def patch_interpreter() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "kvpilot_patched", False):
        return

    def patched(tensor, scope):  # type: ignore[no-untyped-def]
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", _scalar_index)

    patched.kvpilot_patched = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched
