"""Issue 33 items 1 and 4: the compiled-grammar cache is bounded in bytes, grammars over a size are
refused by name, and compiles run on their own pool under a time limit."""

from __future__ import annotations

import asyncio
import threading

import pytest

from kvpilot.engine.make_model import make_model
from kvpilot.engine.structured.compile_pool import CompileBusy, CompilePool, CompileTimeout, PoolClosed
from kvpilot.engine.structured.compiler import GrammarCompiler, GrammarError
from kvpilot.engine.structured.spec import StructuredSpec
from kvpilot.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer(make_model(tmp_path_factory.mktemp("grammar") / "tiny", "llama", "tiny"))


def _compiler(tokenizer: Tokenizer, **limits: int) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, tokenizer.vocab_size, tuple(tokenizer.eos_token_ids), **limits)


def _enum(n: int, tag: str) -> StructuredSpec:
    return StructuredSpec("json_schema", {"enum": [f"{tag}-value-{i}" for i in range(n)]})


def test_the_grammar_cache_is_bounded_in_bytes_not_entries(tokenizer: Tokenizer) -> None:
    one = _compiler(tokenizer).compile(_enum(1000, "probe")).memory_size_bytes
    assert one > 50_000, one  # each grammar below holds tens of kilobytes: a count bound would keep them all
    compiler = _compiler(tokenizer, cache_bytes=4 * one)
    specs = [_enum(1000, f"t{i}") for i in range(10)]
    for spec in specs:
        compiler.compile(spec)
        assert compiler.stats()["bytes"] <= 4 * one
    stats = compiler.stats()
    assert 2 <= stats["entries"] <= 4, stats
    assert compiler.cached(specs[-1]) is not None and compiler.cached(specs[0]) is None  # oldest went first
    assert stats["bytes"] == sum(entry[1] for entry in compiler._cache.values())


def test_a_grammar_over_the_size_limit_is_refused_naming_the_limit(tokenizer: Tokenizer) -> None:
    compiler = _compiler(tokenizer, max_grammar_bytes=20_000)
    with pytest.raises(GrammarError, match=r"compiles to a grammar of \d+ bytes; .* at most 20000 bytes each"):
        compiler.compile(_enum(1000, "big"))
    assert compiler.stats()["entries"] == 0 and compiler.stats()["refused_total"] == 1
    compiler.compile(StructuredSpec("regex", "[0-9]{3}"))  # a small one still compiles
    assert compiler.stats()["entries"] == 1


def test_a_constraint_text_over_the_limit_is_refused_before_compiling(tokenizer: Tokenizer) -> None:
    compiler = _compiler(tokenizer)
    with pytest.raises(GrammarError, match=r"is \d+ characters long .* at most 131072 characters"):
        compiler.compile(_enum(50_000, "huge"))  # 133 MiB and half a minute to compile, were it compiled
    assert compiler.stats()["misses"] == 0 and compiler._compiler is None  # xgrammar never saw it


def test_compiles_past_their_time_limit_are_refused_and_the_pool_goes_on() -> None:
    pool = CompilePool(workers=1, timeout_s=0.2)
    release = threading.Event()

    async def scenario() -> None:
        with pytest.raises(CompileTimeout):
            await pool.run(lambda: release.wait(30))  # a compile that runs far past its limit
        with pytest.raises(CompileBusy):  # its worker is still busy: the next waits no longer than the limit
            await pool.run(lambda: "never run")
        release.set()
        assert await pool.run(lambda: "compiled") == "compiled"
        with pytest.raises(ValueError, match="bad grammar"):
            await pool.run(lambda: (_ for _ in ()).throw(ValueError("bad grammar")))

    asyncio.run(scenario())
    assert pool.stats()["timeouts_total"] == 1 and pool.stats()["busy_total"] == 1
    assert all(thread.daemon for thread in pool._threads)  # an overrunning compile never delays the exit


def test_closing_the_pool_answers_every_waiting_caller_at_once() -> None:
    pool = CompilePool(workers=1, timeout_s=30)
    release = threading.Event()

    async def scenario() -> None:
        waiting = asyncio.ensure_future(pool.run(lambda: release.wait(30)))
        await asyncio.sleep(0.05)
        pool.close()
        with pytest.raises(PoolClosed):
            await asyncio.wait_for(waiting, 2)
        with pytest.raises(PoolClosed):
            await pool.run(lambda: None)

    asyncio.run(scenario())
    release.set()


def test_a_cached_grammar_is_found_again(tokenizer: Tokenizer) -> None:
    compiler = _compiler(tokenizer)
    spec = StructuredSpec("regex", "(ab)+")
    first = compiler.compile(spec)
    assert compiler.compile(spec) is first and compiler.cached(spec) is first
    assert compiler.stats()["hits"] == 2 and compiler.stats()["misses"] == 1
