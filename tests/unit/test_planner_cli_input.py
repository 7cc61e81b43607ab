"""Issue 33 item 13: `kvpilot plan` answers a config or flag it cannot use with exit 2 and a line
naming it, never a traceback, and refuses what the engine would refuse (0 KV heads, block size 7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpilot.cli import main
from tests.unit.test_planner_cli import LLAMA2_7B

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "expected"),
    [(json.dumps({**LLAMA2_7B, "num_attention_heads": 0}), "num_attention_heads must be a positive integer, got 0"),
     (json.dumps({**LLAMA2_7B, "num_key_value_heads": 0}), "num_key_value_heads must be a positive integer, got 0"),
     (json.dumps(LLAMA2_7B).replace('"hidden_size": 4096', '"hidden_size": NaN'), "holds NaN, which JSON does not"),
     (json.dumps(LLAMA2_7B).replace('"vocab_size": 32000', '"vocab_size": Infinity'), "holds Infinity"),
     (json.dumps({**LLAMA2_7B, "num_hidden_layers": 2.5}), "num_hidden_layers must be a positive integer, got 2.5"),
     (json.dumps({**LLAMA2_7B, "head_dim": "128"}), "head_dim must be a positive integer, got '128'"),
     (json.dumps({**LLAMA2_7B, "kv_lora_rank": 512, "qk_rope_head_dim": "x"}), "a field is not a positive integer"),
     (json.dumps({**LLAMA2_7B, "max_position_embeddings": -1}), "max_position_embeddings must be a positive integer"),
     (json.dumps([LLAMA2_7B]), "must hold a JSON object (an HF config.json), not a list"),
     (json.dumps({"text_config": [1]}), "text_config must be an object")],
)  # fmt: skip
def test_a_config_it_cannot_use_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    assert main(["plan", "--config", str(path), "--gpu", "h200"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvpilot plan: ") and expected in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("flags", "expected"),
    [(["--block-size", "7"], "argument --block-size: must be a power of two"),
     (["--block-size", "0"], "argument --block-size: must be a positive integer, got 0"),
     (["--max-seq-len", "0"], "argument --max-seq-len: must be a positive integer, got 0"),
     (["--p95-tokens", "-5"], "argument --p95-tokens: must be a positive integer"),
     (["--gpus", "0"], "argument --gpus: must be a positive integer"),
     (["--max-num-seqs", "0"], "argument --max-num-seqs: must be a positive integer"),
     (["--watermark", "1.5"], "argument --watermark: must be in (0, 1], got 1.5")],
)  # fmt: skip
def test_flags_out_of_range_exit_2_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], expected: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA2_7B))
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--config", str(path), "--gpu", "h200", *flags])
    assert exit_info.value.code == 2 and expected in capsys.readouterr().err
