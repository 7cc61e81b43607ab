"""A request's output constraint compiled before it is admitted: on the grammar pool, under its
time limit, and answered with a 4xx/503 naming the limit instead of a stalled server."""

from __future__ import annotations

from typing import Any

from kvpilot.engine.server.http.errors import APIError
from kvpilot.engine.structured.compile_pool import CompileBusy, CompilePool, CompileTimeout, PoolClosed
from kvpilot.engine.structured.compiler import GrammarError
from kvpilot.engine.structured.spec import StructuredSpec

BUSY_RETRY_AFTER_SECONDS = 1


async def compile_constraint(compiler: Any, pool: CompilePool, spec: StructuredSpec, param: str) -> None:
    """Compile `spec` into the compiler's cache (the engine thread then finds it), or raise an APIError."""
    if compiler.cached(spec) is not None:
        return
    try:
        if not compiler.loaded:  # seconds of imports and vocabulary tables, once: not the constraint's time
            await pool.run(compiler.load, limited=False)
        await pool.run(lambda: compiler.compile(spec))
    except GrammarError as exc:
        raise APIError(400, f"{param}: {exc}", param=param, code="invalid_value") from exc
    except CompileTimeout as exc:
        raise APIError(
            400,
            f"{param}: compiling this constraint took longer than {pool.timeout_s:g} s, this server's limit "
            "(--grammar-compile-timeout); simplify it (less nesting, fewer enum values or alternatives)",
            param=param,
            code="grammar_too_complex",
        ) from exc
    except CompileBusy as exc:
        raise APIError(
            503,
            f"the grammar compiler is busy: {pool.workers} compiles are running and no worker became free within "
            f"{pool.timeout_s:g} s; retry after {BUSY_RETRY_AFTER_SECONDS} s",
            code="grammar_compiler_busy",
            headers={"Retry-After": str(BUSY_RETRY_AFTER_SECONDS)},
        ) from exc
    except PoolClosed as exc:
        raise APIError(
            503, "the server is shutting down: the constraint was not compiled; retry on another replica",
            code="shutdown", headers={"Retry-After": "5"},
        ) from exc  # fmt: skip
