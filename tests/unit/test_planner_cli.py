"""`kvpilot plan` as a user runs it: a config or a checkpoint directory, a GPU, strategy flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpilot.cli import main

pytestmark = pytest.mark.unit

LLAMA2_7B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32000, "torch_dtype": "float16",
    "max_position_embeddings": 4096,
}


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA2_7B))
    return path


def test_plan_prints_the_table(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--config", str(config), "--gpu", "NVIDIA-H200", "--max-seq-len", "4096"]) == 0
    out = capsys.readouterr().out
    assert "KV bytes per token       512 KiB" in out
    assert "per-request peak         2 GiB (256 blocks)" in out
    assert "max concurrency" in out


def test_plan_json_with_strategy_flags(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", "--config", str(config), "--gpu", "h100", "--attention", "gqa", "--kv-head-groups", "8",
               "--kv-cache-dtype", "int8", "--p95-tokens", "3000", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert rc == 0 and plan["feasible"] is True
    assert plan["strategy"] == "gqa8-int8" and plan["max_seq_len"] == 3600
    assert plan["bytes_per_token"] == 64 * 1024 + 32 * 2 * 8 * 4


def test_plan_model_dir_uses_weight_file_sizes(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (config.parent / "model.safetensors").write_bytes(b"\0" * 4096)
    assert main(["plan", "--model", str(config.parent), "--gpu", "l40s", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["weights_bytes"] == 4096


def test_infeasible_plan_exits_1_with_the_reason(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--config", str(config), "--gpu", "a10g", "--max-seq-len", "65536"]) == 1
    out = capsys.readouterr().out
    assert "feasible                 NO" in out and "the longest max_seq_len that fits is" in out


def test_wrong_input_exits_2_naming_it(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--config", str(config), "--gpu", "h200", "--attention", "gqa",
                 "--kv-head-groups", "5"]) == 2
    assert "kv_head_groups 5 must divide the model's 32 KV heads" in capsys.readouterr().err
    assert main(["plan", "--config", str(config), "--gpu", "B999"]) == 2
    assert "not in the planner's table" in capsys.readouterr().err


def test_plan_with_partial_rope_counts_the_exact_rope_keys(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", "--config", str(config), "--gpu", "h200", "--attention", "mla", "--latent-rank", "512",
               "--mla-rope-dims", "16", "--max-seq-len", "4096", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert rc == 0 and plan["strategy"] == "mla512rope16"
    assert plan["bytes_per_token"] == 32 * (512 + 32 * 16) * 2  # fp16 row: latent + 32 KV heads x 16 dims
    assert main(["plan", "--config", str(config), "--gpu", "h200", "--attention", "mla", "--latent-rank", "512",
                 "--mla-rope-dims", "130"]) == 2
    assert "exceeds the model's head_dim 128" in capsys.readouterr().err
