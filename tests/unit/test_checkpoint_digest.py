"""The checkpoint digest of the rollout contract, `kvpilot digest`, and `serve --model-sha256`."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvpilot.checkpoint_digest import DigestMismatch, checkpoint_digest, parse_digest, verify_checkpoint

pytestmark = pytest.mark.unit

KVPILOT = [sys.executable, "-m", "kvpilot.cli"]


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    # Names whose byte order differs from their creation order, and a file that is not a weight.
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"second shard" * 1000)
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"first shard")
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    return tmp_path


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="coreutils sha256sum not installed")
def test_digest_is_sha256_of_the_sha256sum_manifest(checkpoint: Path) -> None:
    (checkpoint / "README.md").write_text("not served")
    (checkpoint / ".hidden.json").write_text("{}")
    manifest = subprocess.run(
        "LC_ALL=C sha256sum *.json *.safetensors | LC_ALL=C sort -k2", shell=True, cwd=checkpoint,
        capture_output=True, check=True,
    ).stdout
    assert manifest.count(b"\n") == 4 and manifest.index(b"00001") < manifest.index(b"00002")
    assert checkpoint_digest(checkpoint) == hashlib.sha256(manifest).hexdigest()


@pytest.mark.parametrize("name", ["tokenizer.json", "config.json", "chat_template.jinja", "tokenizer.model",
                                  "merges.txt", "generation_config.json"])
def test_digest_covers_config_tokenizer_and_chat_template(checkpoint: Path, name: str) -> None:
    digest = checkpoint_digest(checkpoint)
    (checkpoint / name).write_text("swapped")
    assert checkpoint_digest(checkpoint) != digest


def test_digest_changes_with_a_byte_or_a_name_and_ignores_other_files(checkpoint: Path) -> None:
    digest = checkpoint_digest(checkpoint)
    (checkpoint / "README.md").write_text("# a model card")
    (checkpoint / ".cache").mkdir()
    (checkpoint / ".cache" / "x.json").write_text("{}")
    (checkpoint / "original").mkdir()  # a subdirectory is not served
    (checkpoint / "original" / "params.json").write_text("{}")
    assert checkpoint_digest(checkpoint) == digest
    (checkpoint / "model-00001-of-00002.safetensors").write_bytes(b"first sharD")
    changed = checkpoint_digest(checkpoint)
    assert changed != digest
    (checkpoint / "model-00001-of-00002.safetensors").rename(checkpoint / "renamed.safetensors")
    assert checkpoint_digest(checkpoint) not in (digest, changed)


def test_parse_digest_accepts_prefix_and_case_and_refuses_the_rest() -> None:
    hexd = "ab" * 32
    assert parse_digest("sha256:" + hexd.upper()) == hexd
    for bad in ("ab" * 31, "zz" * 32, ""):
        with pytest.raises(ValueError, match="expected 64 hex digits"):
            parse_digest(bad)


def test_mismatch_names_both_digests_and_the_command(checkpoint: Path) -> None:
    wrong = "0" * 64
    with pytest.raises(DigestMismatch) as caught:
        verify_checkpoint(checkpoint, wrong)
    message = str(caught.value)
    assert wrong in message and checkpoint_digest(checkpoint) in message
    assert f"kvpilot digest {checkpoint}" in message
    assert verify_checkpoint(checkpoint, checkpoint_digest(checkpoint)) == checkpoint_digest(checkpoint)


def test_digest_command_prints_the_digest(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    result = subprocess.run([*KVPILOT, "digest", str(checkpoint)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == checkpoint_digest(checkpoint) + "\n"
    empty = tmp_path_factory.mktemp("empty")
    result = subprocess.run([*KVPILOT, "digest", str(empty)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "holds no *.safetensors files" in result.stderr


def test_serve_refuses_a_checkpoint_that_does_not_match(checkpoint: Path) -> None:
    wrong = "f" * 64
    result = subprocess.run(
        [*KVPILOT, "serve", "--model", str(checkpoint), "--model-sha256", wrong],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert wrong in result.stderr and checkpoint_digest(checkpoint) in result.stderr
    assert f"kvpilot digest {checkpoint}" in result.stderr
    assert "refusing to serve" in result.stderr
