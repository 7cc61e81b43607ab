"""Tokenizer from an HF model directory: tokenizer.json via `tokenizers`, chat template via jinja2."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer


class Tokenizer:
    """encode/decode plus the model's chat template."""

    def __init__(self, model_dir: str | Path, eos_token_ids: tuple[int, ...] = ()) -> None:
        root = Path(model_dir)
        path = root / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: kvpilot reads tokenizers in the HF tokenizer.json format"
            )
        self._tok = HFTokenizer.from_file(str(path))
        config_path = root / "tokenizer_config.json"
        self.config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))
        self.chat_template: str | None = self.config.get("chat_template")
        self.add_bos_token = bool(self.config.get("add_bos_token", False))
        eos_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        ids = ([eos_id] if eos_id is not None else []) + [i for i in eos_token_ids if i != eos_id]
        self.eos_token_ids: tuple[int, ...] = tuple(ids)
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def backend(self) -> HFTokenizer:
        """The `tokenizers.Tokenizer` underneath (structured output reads its vocabulary)."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # encode_batch releases the GIL while it works (encode does not): a long prompt tokenised on
        # the server's CPU pool then cannot stall the event loop.
        ids = self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        if not add_special_tokens:
            return ids
        if self.add_bos_token and self.bos_token_id is not None and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **template_kwargs: Any
    ) -> str:
        """Render messages with the model's template; extra keyword arguments (tools, ...) reach it too."""
        if not self.chat_template:
            raise ValueError(
                "this model's tokenizer_config.json has no chat_template; send a plain prompt instead"
            )
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError(f"message {i} must be a dict with 'role' and 'content', got {m!r}")
        template = _ENV.from_string(self.chat_template)
        return template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **template_kwargs,
        )


def _raise(message: str) -> None:
    raise ValueError(f"chat template: {message}")


def _token_text(token: Any) -> str | None:
    if isinstance(token, dict):
        return token.get("content")
    return token


def check_chat_template(text: str) -> str:
    """The template text if Jinja can compile it, else a ValueError naming the line."""
    try:
        _ENV.from_string(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"the chat template does not compile: line {exc.lineno}: {exc.message}") from exc
    return text


_ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
_ENV.globals["raise_exception"] = _raise
_ENV.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:  # fmt: skip
    """transformers' `tojson` (plain json.dumps): Jinja's own HTML-escapes <, > and &, which would
    change the prompt of every template that renders tools or tool calls."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


_ENV.filters["tojson"] = _tojson
