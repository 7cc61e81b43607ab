"""Compile a StructuredSpec into an xgrammar grammar for this tokenizer, with a bounded cache.

xgrammar (and the transformers import it brings) is loaded on the first structured request, so a
server that never sees one pays nothing. Compilation runs on whichever thread asks (the server
compiles on its CPU pool before admitting a request; the engine thread then finds it cached).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

from kvpilot.engine.structured.spec import StructuredSpec

CACHE_ENTRIES = 256  # compiled grammars kept (most recently used); a schema recompiles after eviction


class GrammarError(ValueError):
    """The constraint cannot be compiled; the message says why (it becomes the 400's message)."""


class GrammarCompiler:
    """Spec -> xgrammar CompiledGrammar over the model's vocabulary (the logits' width)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...]) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = tuple(stop_token_ids)
        self._compiler: Any = None
        self._json_safe: Any = None
        self._info: Any = None
        self._init_lock = threading.Lock()
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def compile(self, spec: StructuredSpec) -> Any:
        key = spec.key
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return compiled
        compiled = self._compile(spec)
        with self._lock:
            self.misses += 1
            self._cache[key] = compiled
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
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
            raise GrammarError(f"xgrammar cannot compile this {spec.kind.replace('_', ' ')}: {_clean(exc)}") from exc

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
            return {"entries": len(self._cache), "hits": self.hits, "misses": self.misses}


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
