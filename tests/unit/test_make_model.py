"""make-model works without transformers and writes a complete, loadable HF-format directory."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

SCRIPT = """
import sys
sys.modules["transformers"] = None  # any import of transformers now fails
from kvpilot.cli import main
raise SystemExit(main(["make-model", sys.argv[1], "--family", "mistral", "--kv-heads", "4", "--seed", "2"]))
"""


def test_make_model_without_transformers(tmp_path) -> None:
    out = tmp_path / "m"
    subprocess.run([sys.executable, "-c", SCRIPT, str(out)], check=True, capture_output=True)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["MistralForCausalLM"] and config["num_key_value_heads"] == 4
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).is_file(), name
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert [tok.token_to_id(t) for t in ("<bos>", "<eos>", "<pad>")] == [0, 1, 2]
    assert 259 < tok.get_vocab_size() <= config["vocab_size"]
    text = "naïve café: ✓"
    assert tok.decode(tok.encode(text).ids) == text


def test_make_model_refuses_bad_arguments(tmp_path) -> None:
    from kvpilot.engine.make_model import model_config

    with pytest.raises(ValueError, match="family 'gpt2' is not supported"):
        model_config("gpt2")
    with pytest.raises(ValueError, match="size 'huge' is not supported"):
        model_config("llama", "huge")
