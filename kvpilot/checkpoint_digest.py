"""`kvpilot digest DIR`: one SHA256 that pins a whole checkpoint (what `serve --model-sha256` checks).

The digest is the sha256 of a sha256sum-style manifest: one line `"<sha256 of file>  <file name>\n"`
per served file of the directory, sorted by name. Served files are the top-level, non-hidden files
whose suffix is one the engine reads: the weights (*.safetensors) and what shapes its output beside
them (config.json, generation_config.json, the tokenizer's files, the chat template: *.json, *.jinja,
*.model, *.txt, *.tiktoken). So a swapped tokenizer or chat template is refused as a swapped weight
is. `sha256sum <those files> | sha256sum` prints the same value in a shell whose locale sorts like
Python (LC_ALL=C). Torch-free, so the operator and the storage initializer import it.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

WEIGHT_GLOB = "*.safetensors"
# Suffixes of the files a digest covers (and the storage initializer fetches): weights, config,
# generation config, tokenizer (json, sentencepiece .model, BPE vocab/merges .txt, .tiktoken), chat template.
SERVED_SUFFIXES = (".safetensors", ".json", ".jinja", ".model", ".txt", ".tiktoken")
_HEX64 = re.compile(r"[0-9a-f]{64}")


class DigestMismatch(ValueError):
    """The checkpoint on disk is not the one the digest pins."""


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def weight_files(model_dir: Path) -> list[Path]:
    files = sorted((p for p in Path(model_dir).glob(WEIGHT_GLOB) if p.is_file()), key=lambda p: p.name)
    if not files:
        raise FileNotFoundError(f"{model_dir} holds no {WEIGHT_GLOB} files: nothing to digest")
    return files


def is_served_file(name: str) -> bool:
    """A file name the digest covers: not hidden, with one of SERVED_SUFFIXES."""
    return not name.startswith(".") and name.endswith(SERVED_SUFFIXES)


def digested_files(model_dir: Path) -> list[Path]:
    """The weights and the served files beside them, sorted by name (bytes, as LC_ALL=C sorts)."""
    weight_files(model_dir)  # a directory without weights is refused, whatever else it holds
    files = (p for p in Path(model_dir).iterdir() if is_served_file(p.name) and p.is_file())
    return sorted(files, key=lambda p: p.name.encode())


def manifest(model_dir: Path) -> str:
    """The sha256sum-style manifest the digest is taken over."""
    return "".join(f"{file_sha256(p)}  {p.name}\n" for p in digested_files(model_dir))


def manifest_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def checkpoint_digest(model_dir: Path) -> str:
    return manifest_digest(manifest(model_dir))


def parse_digest(value: str) -> str:
    """A digest as users write it (64 hex digits, optional `sha256:` prefix) -> lower-case hex."""
    text = value.strip().lower().removeprefix("sha256:")
    if not _HEX64.fullmatch(text):
        raise ValueError(
            f"{value!r} is not a SHA256 digest: expected 64 hex digits (optionally prefixed 'sha256:'); "
            "print a checkpoint's with `kvpilot digest DIR`"
        )
    return text


def verify_checkpoint(model_dir: Path, expected: str) -> str:
    """The digest, or DigestMismatch naming both digests and the command that prints the right one."""
    want = parse_digest(expected)
    got = checkpoint_digest(model_dir)
    if got != want:
        raise DigestMismatch(
            f"the checkpoint in {model_dir} does not match --model-sha256: expected {want}, its "
            f"{len(digested_files(model_dir))} file(s) (weights, config, tokenizer, chat template) digest to "
            f"{got}; refusing to serve it. "
            f"Check the model path, or print the digest of the checkpoint you trust with "
            f"`kvpilot digest {model_dir}`"
        )
    return got


def _digest_arg(value: str) -> str:
    try:
        return parse_digest(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path,
                        help="HF-format model directory (its weights, config, tokenizer and chat template)")
    parser.add_argument("--manifest", action="store_true", help="also print the per-file manifest")


def run(args: argparse.Namespace) -> int:
    try:
        text = manifest(args.model)
    except OSError as exc:
        print(f"kvpilot digest: {exc}", file=sys.stderr)
        return 2
    if args.manifest:
        sys.stdout.write(text)
    print(manifest_digest(text))
    return 0
