"""Compile a StructuredSpec into an xgrammar grammar for this tokenizer, with a bounded cache.

xgrammar (and the transformers import it brings) is loaded on the first structured request, so a
server that never sees one pays nothing. Compilation runs on whichever thread asks (the server
compiles on its own grammar pool, under a time limit, before admitting a request: compile_pool.py;
the engine thread then finds it cached).

The cache is bounded in bytes (each compiled grammar's own `memory_size_bytes`), not in entries:
a grammar can hold from kilobytes to hundreds of megabytes (a 50,000-value enum, for instance).
A constraint whose text is longer than `max_spec_chars`, or that compiles to more than
`max_grammar_bytes`, is refused with a GrammarError naming the limit.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

from kvpilot.engine.structured.spec import StructuredSpec

CACHE_BYTES = 512 * 1024 * 1024  # compiled grammars kept, most recently used first; evicted ones recompile
MAX_GRAMMAR_BYTES = 64 * 1024 * 1024  # one compiled grammar at most (refused above)
MAX_SPEC_CHARS = 128 * 1024  # a constraint's text (its JSON form for a schema) at most, checked before compiling


class GrammarError(ValueError):
    """The constraint cannot be compiled; the message says why (it becomes the 400's message)."""


class GrammarCompiler:
    """Spec -> xgrammar CompiledGrammar over the model's vocabulary (the logits' width)."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: tuple[int, ...],
        *,
        cache_bytes: int = CACHE_BYTES,
        max_grammar_bytes: int = MAX_GRAMMAR_BYTES,
        max_spec_chars: int = MAX_SPEC_CHARS,
    ) -> None:
        self.cache_bytes = cache_bytes
        self.max_grammar_bytes = max_grammar_bytes
        self.max_spec_chars = max_spec_chars
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = tuple(stop_token_ids)
        self._compiler: Any = None
        self._json_safe: Any = None
        self._info: Any = None
        self._init_lock = threading.Lock()
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[Any, int]] = OrderedDict()  # key -> (compiled, bytes)
        self.cached_bytes = 0
        self.refused_total = 0  # constraints refused for their size
        self.hits = 0
        self.misses = 0

    def cached(self, spec: StructuredSpec) -> Any | None:
        """The compiled grammar if it is in the cache (counted as a hit), else None."""
        key = spec.key
        with self._lock:
            entry = self._cache.get(key)
            if entry is None:
                return None
            self._cache.move_to_end(key)
            self.hits += 1
            return entry[0]

    def compile(self, spec: StructuredSpec) -> Any:
        found = self.cached(spec)
        if found is not None:
            return found
        key = spec.key
        if len(key) > self.max_spec_chars:
            self.refused_total += 1
            raise GrammarError(
                f"this {_kind(spec)} is {len(key)} characters long (as compact JSON); this server compiles "
                f"constraints of at most {self.max_spec_chars} characters: simplify it or shorten its enums"
            )
        compiled = self._compile(spec)
        size = int(compiled.memory_size_bytes)
        if size > self.max_grammar_bytes:
            self.refused_total += 1
            raise GrammarError(
                f"this {_kind(spec)} compiles to a grammar of {size} bytes; this server keeps grammars of at most "
                f"{self.max_grammar_bytes} bytes each: simplify it (fewer enum values, fewer alternatives)"
            )
        with self._lock:
            self.misses += 1
            if key not in self._cache:
                self._cache[key] = (compiled, size)
                self.cached_bytes += size
            while self.cached_bytes > self.cache_bytes and len(self._cache) > 1:
                _, (_, evicted) = self._cache.popitem(last=False)
                self.cached_bytes -= evicted
        return compiled

    def _compile(self, spec: StructuredSpec) -> Any:
        compiler = self._xgrammar_compiler()
        try:
            if spec.kind == "json_schema":
                # Compact JSON (no free whitespace between tokens): a model cannot pad with spaces
                # or newlines until max_tokens, which unconstrained whitespace allows.
                return compiler.compile_json_schema(spec.value, any_whitespace=False)
            if spec.kind == "json_object":
                return compiler.compile_json_schema({"type": "object"}, any_whitespace=False, strict_mode=False)
            if spec.kind == "regex":
                return compiler.compile_regex(spec.value)
            if spec.kind == "choice":
                return compiler.compile_grammar("root ::= " + " | ".join(ebnf_literal(c) for c in spec.value))
            return compiler.compile_grammar(spec.value)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise GrammarError(f"xgrammar cannot compile this {_kind(spec)}: {_clean(exc)}") from exc

    @property
    def loaded(self) -> bool:
        """xgrammar and the vocabulary's tables are loaded (the first compile loads them, for seconds)."""
        return self._compiler is not None

    def load(self) -> None:
        """Load xgrammar and the vocabulary's tables now (the server does this outside the time limit)."""
        self._xgrammar_compiler()

    def _xgrammar_compiler(self) -> Any:
        with self._init_lock:
            return self._xgrammar_compiler_locked()

    def _xgrammar_compiler_locked(self) -> Any:
        if self._compiler is None:
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(
                _hf_tokenizer(self._tokenizer), vocab_size=self.vocab_size, stop_token_ids=list(self.stop_token_ids)
            )
            self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
            self._info = info
        return self._compiler

    def json_safe_words(self) -> Any:
        """int32 bitmask words [ceil(V / 32)]: bit t set unless token t's bytes hold a control byte (< 0x20).

        Compact JSON never needs a raw control byte (inside strings they must be escaped), but
        xgrammar's length-bounded string rule lets them through; JSON rows are ANDed with this.
        """
        import numpy as np

        with self._init_lock:
            if self._json_safe is None:
                self._xgrammar_compiler_locked()
                vocab = self._info.decoded_vocab
                bits = np.ones(-(-self.vocab_size // 32) * 32, dtype=np.uint8)
                for token, raw in enumerate(vocab[: self.vocab_size]):
                    if any(b < 0x20 for b in raw):
                        bits[token] = 0
                self._json_safe = np.packbits(bits, bitorder="little").view("<i4").copy()
            return self._json_safe

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "entries": len(self._cache), "bytes": self.cached_bytes, "hits": self.hits, "misses": self.misses,
                "refused_total": self.refused_total,
            }  # fmt: skip


def _kind(spec: StructuredSpec) -> str:
    return spec.kind.replace("_", " ")


def _hf_tokenizer(tokenizer: Any) -> Any:
    """The transformers fast tokenizer xgrammar reads the vocabulary and its byte encoding from."""
    from transformers import PreTrainedTokenizerFast

    backend = getattr(tokenizer, "backend", tokenizer)  # kvpilot's Tokenizer wraps a `tokenizers.Tokenizer`
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def ebnf_literal(text: str) -> str:
    """A string literal of xgrammar's EBNF that matches exactly `text`."""
    escapes = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    body = "".join(escapes.get(ch, f"\\x{ord(ch):02x}" if ord(ch) < 0x20 else ch) for ch in text)
    return f'"{body}"'


_LOCATION = re.compile(r"^\[[0-9:]+\] \S+?:\d+: ")


def _clean(exc: BaseException) -> str:
    """xgrammar's message without its C++ timestamp and source location."""
    return _LOCATION.sub("", str(exc).strip()).strip()
