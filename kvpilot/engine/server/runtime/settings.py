"""ServerSettings: every `kvpilot serve` setting that is not an EngineConfig knob, one field per flag.

As config/arguments.py does for EngineConfig: a field made with `flag(...)` becomes `--field-name` (or
its `name`), typed from the annotation, with the field's default, in the section (argument group) it
names; `settings_from_args` builds the settings from the parsed flags in one place. The fields made
with `field(...)` are no flags: the server fills them in as it starts (the served name and strategy
label once the engine config is known, the chat template's text).
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpilot.engine.metrics.stats_contract import DEFAULT_STATS_PORT
from kvpilot.engine.server.http.auth import read_key_file
from kvpilot.engine.server.http.connections import DEFAULT_HEADER_TIMEOUT_SECONDS, DEFAULT_MAX_CONNECTIONS
from kvpilot.engine.server.http.request_guard import DEFAULT_BODY_TIMEOUT_SECONDS, DEFAULT_MAX_BODY_BYTES
from kvpilot.engine.server.runtime.faults import FaultSettings
from kvpilot.engine.server.runtime.idempotency import DEFAULT_MAX_BYTES as DEFAULT_IDEMPOTENCY_BYTES
from kvpilot.engine.structured.compile_pool import COMPILE_TIMEOUT_SECONDS
from kvpilot.engine.structured.compiler import CACHE_BYTES as GRAMMAR_CACHE_BYTES
from kvpilot.engine.structured.compiler import MAX_GRAMMAR_BYTES

DEFAULT_CPU_MEMORY_BUDGET = "256MiB"
PLAN = "capacity plan"
API = "API"
FAULTS = "fault injection (TEST ONLY: for rollout and reliability tests; never in production)"
SECTIONS = (None, PLAN, API, FAULTS)  # in the help's order; None: the parser's own options
TOOL_CALL_PARSERS = ("auto", "hermes", "llama3_json", "none")
ENGINE_CORES = ("auto", "thread", "process")
LOG_LEVELS = ("debug", "info", "warning", "error")


def _shape_names() -> list[str]:
    from kvpilot.bench.shapes import SHAPES

    return sorted(SHAPES)


def flag(default: Any, help: str | None = None, *, section: str | None = None, name: str | None = None,
         metavar: str | None = None, choices: Sequence[str] | Callable[[], Sequence[str]] | None = None,
         exclusive: str | None = None, required: bool = False, repr: bool = True) -> Any:  # fmt: skip
    """A field that is also a flag. A bool that defaults to True is turned off by `name` (`--no-...`);
    fields with the same `exclusive` go in one mutually exclusive group (`required`: one must be given)."""
    metadata = {"flag": name, "help": help, "section": section, "metavar": metavar, "choices": choices,
                "exclusive": exclusive, "required": required}  # fmt: skip
    return field(default=default, metadata=metadata, repr=repr)


@dataclass
class ServerSettings:
    """What the server needs to know besides the engine config: listeners, limits, API behaviour, faults."""

    # (RUF009: ruff does not know that a Path default of None is immutable)
    model: Path | None = flag(None, "HF-format model directory", exclusive="source", required=True)  # noqa: RUF009
    shape: str | None = flag(
        None, "random weights of a published model's shape (--load-format dummy), with a tokenizer over its whole "
        "vocabulary", choices=_shape_names, exclusive="source", required=True,
    )  # fmt: skip
    model_sha256: str | None = flag(
        None, "refuse to start unless the checkpoint digest matches (sha256 of the sha256sum-style manifest of the "
        "*.safetensors files; print it with `kvpilot digest DIR`)", metavar="HEX",
    )  # fmt: skip
    model_name: str | None = flag(None, "name clients pass as `model` (default: the directory name)",
                           name="--served-model-name")  # fmt: skip
    host: str = flag("127.0.0.1")
    port: int = flag(8000)
    stats_host: str = flag("127.0.0.1", "the stats feed binds here (sidecar only)")
    stats_port: int = flag(DEFAULT_STATS_PORT)

    kv_watermark: float = flag(0.8, "share of free memory for the KV pool", section=PLAN)
    cpu_memory_budget: str = flag(
        DEFAULT_CPU_MEMORY_BUDGET, f"memory the plan may use on CPU, weights included (default "
        f"{DEFAULT_CPU_MEMORY_BUDGET})", section=PLAN,
    )  # fmt: skip

    strategy: str | None = flag(None, "X-Model-Strategy value (default: from the engine config)", section=API,
                         name="--strategy-name")  # fmt: skip
    max_queue: int = flag(256, "requests waiting beyond max-num-seqs", section=API)
    idempotency_ttl_seconds: float = flag(600.0, "seconds an Idempotency-Key is kept", section=API,
                                          name="--idempotency-ttl")  # fmt: skip
    idempotency_max_keys: int = flag(10_000, section=API)
    idempotency_max_bytes: int = flag(
        DEFAULT_IDEMPOTENCY_BYTES, "memory the kept results may hold together; the oldest go first (default "
        f"{DEFAULT_IDEMPOTENCY_BYTES})", section=API,
    )  # fmt: skip
    max_body_bytes: int = flag(
        DEFAULT_MAX_BODY_BYTES, "largest request body accepted; larger ones get a 413 before they are read (default "
        f"{DEFAULT_MAX_BODY_BYTES})", section=API,
    )  # fmt: skip
    header_timeout: float = flag(
        DEFAULT_HEADER_TIMEOUT_SECONDS, "seconds a connection may take to send its request headers (from opening, "
        "or from its previous response); slower ones get a 408 and are closed (default "
        f"{DEFAULT_HEADER_TIMEOUT_SECONDS:g})", section=API, metavar="S",
    )  # fmt: skip
    keep_alive_timeout: float = flag(5.0, "seconds an idle keep-alive connection stays open (default 5)",
                                     section=API, metavar="S")  # fmt: skip
    max_connections: int = flag(
        DEFAULT_MAX_CONNECTIONS, "API connections open at most (never more than half the open-files limit); at the "
        "cap a new one closes the longest-idle one, or gets a 503 when all are busy (default "
        f"{DEFAULT_MAX_CONNECTIONS})", section=API,
    )  # fmt: skip
    body_timeout_seconds: float = flag(
        DEFAULT_BODY_TIMEOUT_SECONDS, "seconds a request body may take to arrive once its headers have; slower ones "
        f"get a 408 (default {DEFAULT_BODY_TIMEOUT_SECONDS:g})", section=API, metavar="S", name="--body-timeout",
    )  # fmt: skip
    max_concurrent_scores: int = flag(4, "POST /v1/score requests in flight at most; more get a 429 with "
                                      "Retry-After", section=API)  # fmt: skip
    score_route: bool = flag(True, "serve no POST /v1/score (404), as an engine without it; the accuracy gate then "
                             "scores with echo", section=API, name="--no-score-route")  # fmt: skip
    grammar_compile_timeout: float = flag(
        COMPILE_TIMEOUT_SECONDS, "seconds a structured-output constraint may take to compile; slower ones get a 400 "
        f"naming this limit (default {COMPILE_TIMEOUT_SECONDS:g})", section=API, metavar="S",
    )  # fmt: skip
    grammar_cache_bytes: int = flag(
        GRAMMAR_CACHE_BYTES, "memory the compiled-grammar cache may hold; the least recently used go first (default "
        f"{GRAMMAR_CACHE_BYTES})", section=API,
    )  # fmt: skip
    max_grammar_bytes: int = flag(MAX_GRAMMAR_BYTES, "largest compiled grammar accepted; larger ones get a 400 "
                                  f"(default {MAX_GRAMMAR_BYTES})", section=API)  # fmt: skip
    api_key: str | None = flag(
        None, "require `Authorization: Bearer KEY` on every route but /health and /ready (prefer --api-key-file: a "
        "flag shows in the process list)", section=API, exclusive="key", repr=False,
    )  # fmt: skip
    api_key_file: Path | None = flag(  # noqa: RUF009
        None, "read the API key from this file (e.g. a mounted Secret)", section=API, exclusive="key",
    )  # fmt: skip
    chat_template: Path | None = flag(  # noqa: RUF009
        None, "a Jinja chat template file for /v1/chat/completions (checkpoints without one, or to replace theirs)",
        section=API,
    )  # fmt: skip
    tool_call_parser: str = flag(
        "auto", "how tool calls are read from the output under tool_choice 'auto': hermes "
        "(<tool_call>{...}</tool_call>), llama3_json ({\"name\", \"parameters\"}), none (auto refused), or auto: "
        "from the chat template", section=API, choices=TOOL_CALL_PARSERS,
    )  # fmt: skip
    warmup: bool = flag(True, "skip the start-up warm-up", section=API, name="--no-warmup")
    engine_core: str = flag(
        "auto", "where the engine steps: a thread of the API process, or a process of its own (HTTP, tokenising "
        "and streaming then never wait for the engine's Python; engine/server/runtime/core_process.py). auto: a "
        "process on one CUDA device, a thread on CPU and under tensor parallelism", section=API, choices=ENGINE_CORES,
    )  # fmt: skip
    shutdown_grace: float = flag(30.0, "seconds in-flight requests get on SIGTERM", section=API)
    log_level: str = flag("info", section=API, choices=LOG_LEVELS)

    fault_latency_ms: float = flag(
        0.0, "TEST ONLY: sleep MS before every engine step, so TTFT and every inter-token gap rise by about MS "
        "(default 0: off)", section=FAULTS, metavar="MS",
    )  # fmt: skip
    fault_error_rate: float = flag(
        0.0, "TEST ONLY: answer this share (0-1) of generation requests with HTTP 500, counted in "
        "requests_failed_total{reason=\"fault\"} (default 0: off)", section=FAULTS, metavar="P",
    )  # fmt: skip
    fault_seed: int | None = flag(None, "TEST ONLY: seed for --fault-error-rate draws", section=FAULTS)

    default_completion_max_tokens: int = 16  # /v1/completions default, as OpenAI's
    chat_template_text: str | None = None  # --chat-template's text, checked to compile; replaces the tokenizer's own
    faults: FaultSettings = field(init=False, repr=False)  # the three --fault-* flags, checked

    def __post_init__(self) -> None:
        self.faults = FaultSettings(self.fault_latency_ms, self.fault_error_rate, self.fault_seed)
        if self.max_body_bytes < 1 or self.max_concurrent_scores < 1 or self.idempotency_max_bytes < 1:
            raise ValueError("--max-body-bytes, --max-concurrent-scores and --idempotency-max-bytes must be at least 1")
        if not self.body_timeout_seconds > 0:
            raise ValueError(f"--body-timeout must be positive, got {self.body_timeout_seconds}")
        if not self.header_timeout > 0 or not self.keep_alive_timeout > 0 or self.max_connections < 1:
            raise ValueError(f"--header-timeout and --keep-alive-timeout must be positive and --max-connections >= 1, "
                             f"got {self.header_timeout}, {self.keep_alive_timeout}, {self.max_connections}")  # fmt: skip
        if (not self.grammar_compile_timeout > 0 or self.max_grammar_bytes < 1
                or self.grammar_cache_bytes < self.max_grammar_bytes):  # fmt: skip
            raise ValueError("--grammar-compile-timeout must be > 0, --max-grammar-bytes >= 1 and --grammar-cache-bytes "
                             f"at least --max-grammar-bytes; got {self.grammar_compile_timeout}, "
                             f"{self.max_grammar_bytes}, {self.grammar_cache_bytes}")  # fmt: skip


def setting_fields() -> list[dataclasses.Field]:
    """The fields that are flags, in declaration order."""
    return [f for f in dataclasses.fields(ServerSettings) if "flag" in f.metadata]


def _flag_type(annotation: Any, name: str) -> type:
    """int, float, str, bool or Path from `T` or `T | None`; anything else is not a flag."""
    options = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    if len(options) == 1 and options[0] in (int, float, str, bool, Path):
        return options[0]
    raise TypeError(f"ServerSettings.{name}: a flag needs an int, float, str, bool or Path field, not {annotation}")


def add_setting_arguments(group: argparse._ActionsContainer, section: str | None) -> None:
    """Add the flags of one section to the parser or argument group, in the fields' order."""
    hints = typing.get_type_hints(ServerSettings)
    exclusive: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for f in (f for f in setting_fields() if f.metadata["section"] == section):
        meta = f.metadata
        name = meta["flag"] or "--" + f.name.replace("_", "-")
        kind = _flag_type(hints[f.name], f.name)
        kwargs: dict[str, Any] = {"dest": f.name, "default": f.default, "help": meta["help"]}
        if kind is bool:
            if f.default and not (meta["flag"] or "").startswith("--no-"):
                raise TypeError(f"ServerSettings.{f.name}: a flag that turns a True default off is named --no-...")
            kwargs["action"] = "store_false" if f.default else "store_true"
        else:
            kwargs["metavar"] = meta["metavar"] or name.removeprefix("--").replace("-", "_").upper()
            if kind is not str:
                kwargs["type"] = kind
        choices = meta["choices"]
        if choices is not None:
            kwargs["choices"] = choices() if callable(choices) else choices
            if meta["metavar"] is None:
                del kwargs["metavar"]  # argparse shows the choices
        target = group
        if meta["exclusive"] is not None:
            if meta["exclusive"] not in exclusive:
                exclusive[meta["exclusive"]] = group.add_mutually_exclusive_group(required=meta["required"])
            target = exclusive[meta["exclusive"]]
        target.add_argument(name, **kwargs)


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """The parsed flags as ServerSettings, checked, with the API key read from --api-key-file and the chat
    template read and compiled; a ValueError names the flag that is wrong."""
    settings = ServerSettings(**{f.name: getattr(args, f.name) for f in setting_fields()})
    api_key = read_key_file(settings.api_key_file) if settings.api_key_file else settings.api_key
    template = read_chat_template(settings.chat_template) if settings.chat_template else None
    return dataclasses.replace(settings, api_key=api_key, chat_template_text=template)


def read_chat_template(path: Path) -> str:
    """--chat-template FILE's text, checked to compile, or a ValueError saying what is wrong."""
    from kvpilot.engine.tokenizer import check_chat_template

    if not path.is_file():
        raise ValueError(f"--chat-template {path}: no such file; give a Jinja template file")
    try:
        return check_chat_template(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"--chat-template {path}: {exc}") from exc
