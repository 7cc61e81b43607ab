"""DeepSeek-V3 checkpoints with multi-token-prediction (MTP) layers load; their tensors are skipped.

A tiny random V3 checkpoint is re-saved as real V3 releases are: sharded through an index, with the
MTP module as `model.layers.{num_hidden_layers}.*` (embed_tokens, enorm, hnorm, eh_proj,
shared_head and a full decoder layer) and `num_nextn_predict_layers: 1` in config.json. It must
generate exactly what the checkpoint without those tensors generates, log what it skipped, and any
other unknown tensor must still be refused by name.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from kvpilot.engine.llm import LLM
from tests.helpers.deepseek import build_deepseek_checkpoint
from tests.parity.helpers import assert_varied, greedy_ids

pytestmark = pytest.mark.parity

PROMPTS = [[5, 17, 99, 3], [200, 7, 42, 42, 11, 300, 8]]
MTP_EXTRAS = ("embed_tokens.weight", "enorm.weight", "hnorm.weight", "eh_proj.weight")
MTP_HEAD = ("shared_head.norm.weight", "shared_head.head.weight")


def mtp_tensors(base: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """An MTP layer as V3 stores it: the last decoder layer's tensors renamed, plus the MTP glue."""
    gen = torch.Generator().manual_seed(7)
    last, mtp = f"model.layers.{num_layers - 1}.", f"model.layers.{num_layers}."
    out = {
        mtp + n[len(last) :]: torch.randn(t.shape, generator=gen)
        for n, t in base.items()
        if n.startswith(last)
    }
    hidden = base["model.norm.weight"].shape[0]
    vocab = base["model.embed_tokens.weight"].shape[0]
    shapes = {
        "embed_tokens.weight": (vocab, hidden),
        "enorm.weight": (hidden,),
        "hnorm.weight": (hidden,),
        "eh_proj.weight": (hidden, 2 * hidden),
        "shared_head.norm.weight": (hidden,),
        "shared_head.head.weight": (vocab, hidden),
    }
    out.update({mtp + n: torch.randn(shape, generator=gen) for n, shape in shapes.items()})
    return out


def save_sharded(out_dir: Path, src: Path, shards: list[dict[str, torch.Tensor]], **config: object) -> Path:
    """Copy src's config/tokenizer into out_dir, write the tensors as index-listed shards."""
    shutil.copytree(src, out_dir)
    (out_dir / "model.safetensors").unlink()
    weight_map = {}
    for i, tensors in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(out_dir / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
    (out_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    cfg_path = out_dir / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), **config}))
    return out_dir


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("mtp")
    base_dir = build_deepseek_checkpoint(root / "base", version=3, seed=5, num_nextn_predict_layers=1)
    base = load_file(str(base_dir / "model.safetensors"))
    num_layers = json.loads((base_dir / "config.json").read_text())["num_hidden_layers"]
    mtp = mtp_tensors(base, num_layers)
    with_mtp = save_sharded(root / "with_mtp", base_dir, [base, mtp], num_nextn_predict_layers=1)
    return {"base": base_dir, "with_mtp": with_mtp, "mtp": mtp, "root": root, "num_layers": num_layers}


def generate(path: Path) -> list[list[int]]:
    return greedy_ids(LLM(str(path), show_progress=False), PROMPTS, 8)


def test_mtp_layer_is_skipped_and_generation_unchanged(checkpoints, caplog) -> None:
    mtp = checkpoints["mtp"]
    n = checkpoints["num_layers"]
    assert any(k.startswith(f"model.layers.{n}.self_attn.") for k in mtp)
    assert any(k.startswith(f"model.layers.{n}.mlp.experts.") for k in mtp)
    assert all(f"model.layers.{n}.{e}" in mtp for e in MTP_EXTRAS + MTP_HEAD)
    expected = generate(checkpoints["base"])
    assert_varied(expected)
    with caplog.at_level(logging.INFO, logger="kvpilot.engine.worker.loader"):
        got = generate(checkpoints["with_mtp"])
    assert got == expected
    skipped = [r.getMessage() for r in caplog.records if r.name == "kvpilot.engine.worker.loader"]
    mtp_bytes = sum(t.numel() * t.element_size() for t in mtp.values())
    assert len(skipped) == 1, skipped
    assert f"skipped {len(mtp)} checkpoint tensors ({mtp_bytes} bytes" in skipped[0]
    assert "num_nextn_predict_layers=1" in skipped[0]


@pytest.mark.parametrize(
    ("case", "extra_name", "config"),
    [
        ("unrelated", "model.vision_tower.proj.weight", {"num_nextn_predict_layers": 1}),
        ("beyond-mtp", "model.layers.{beyond}.input_layernorm.weight", {"num_nextn_predict_layers": 1}),
        ("mtp-not-declared", None, {"num_nextn_predict_layers": 0}),
    ],
)
def test_other_unknown_tensors_are_refused_by_name(checkpoints, case: str, extra_name, config) -> None:
    n = checkpoints["num_layers"]
    base = load_file(str(checkpoints["base"] / "model.safetensors"))
    extra = dict(checkpoints["mtp"])
    if extra_name is None:  # the MTP tensors themselves, but config.json declares no MTP layers
        unknown = re.escape(f"model.layers.{n}.") + r"[\w.]+"
    else:
        extra[extra_name.format(beyond=n + 1)] = torch.ones(8)
        unknown = re.escape(extra_name.format(beyond=n + 1))
    path = save_sharded(checkpoints["root"] / case, checkpoints["base"], [base, extra], **config)
    with pytest.raises(ValueError, match=f"tensor '{unknown}' has no matching parameter") as err:
        LLM(str(path), show_progress=False)
    assert "config.json" in str(err.value)
