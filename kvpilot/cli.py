"""The `kvpilot` command: each sub-command lives in its own module, imported only when used."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). A module defines `add_arguments(parser)` and `run(args) -> int`.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("kvpilot.engine.server.cli", "run the inference engine with its OpenAI-compatible API"),
    "digest": ("kvpilot.checkpoint_digest", "print a checkpoint's SHA256 digest (for serve --model-sha256)"),
    "storage-init": ("kvpilot.storage.init", "fetch a model from oci://, s3:// or hf:// into the node cache"),
    "plan": ("kvpilot.planner.cli", "print the KV capacity plan for a model config and GPU"),
    "make-model": ("kvpilot.engine.make_model", "write a small random checkpoint and tokenizer"),
    "sidecar": ("kvpilot.sidecar.cli", "export engine and GPU metrics for Prometheus"),
    "operator": ("kvpilot.operator.cli", "run the InferenceService operator (kopf)"),
    "cluster": ("kvpilot.cluster.cli", "start/stop a local control plane with fake GPU nodes"),
    "demo": ("kvpilot.demo", "the end-to-end demo"),
    "bench": ("kvpilot.bench.cli", "benchmarks: offline engine throughput, serving load (TTFT/TPOT)"),
}
# The pyproject extra whose packages a command imports (an image installs only some extras).
EXTRAS: dict[str, str] = {"serve": "engine", "make-model": "engine", "sidecar": "sidecar", "operator": "operator",
                          "storage-init": "storage", "demo": "all", "bench": "engine"}


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvpilot", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        parser = _top_parser()
        if argv and not argv[0].startswith("-"):
            parser.print_usage(sys.stderr)
            print(
                f"kvpilot: unknown command {argv[0]!r}; choose one of: {', '.join(COMMANDS)}",
                file=sys.stderr,
            )
            return 2
        parser.parse_args(argv)
        parser.print_help()
        return 0
    name, rest = argv[0], argv[1:]
    module_name, help_text = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            print(f"kvpilot: the '{name}' command is not available in this build", file=sys.stderr)
            return 2
        if _missing_extra(name, exc):
            return 2
        raise
    parser = argparse.ArgumentParser(prog=f"kvpilot {name}", description=help_text)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except ModuleNotFoundError as exc:  # commands import their heavy dependencies lazily
        if _missing_extra(name, exc):
            return 2
        raise


def _missing_extra(command: str, exc: ModuleNotFoundError) -> bool:
    """Name the extra to install when a third-party module of `command` is missing."""
    if not exc.name or exc.name.startswith("kvpilot") or command not in EXTRAS:
        return False
    extra = EXTRAS[command]
    print(f"kvpilot: the '{command}' command needs the '{extra}' extra (module {exc.name!r} is not "
          f"installed): pip install 'kvpilot[{extra}]'", file=sys.stderr)
    return True


if __name__ == "__main__":
    sys.exit(main())
