"""Each tensor-parallel rank reads only its slices from the safetensors files (get_slice), never a whole
sharded tensor, and its parameters are exactly those slices of the checkpoint (no process group needed:
building and loading a rank's shard runs no collective)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from kvpilot.engine.config import ModelConfig
from kvpilot.engine.layers.parallel import tp_shards
from kvpilot.engine.make_model import make_model
from kvpilot.engine.models import build_model
from kvpilot.engine.parallel.state import TPGroup, set_tp
from kvpilot.engine.worker import loader

pytestmark = pytest.mark.unit


class _Recording:
    """safe_open that records which tensors were read whole."""

    whole: ClassVar[list[str]] = []

    def __init__(self, path: str, framework: str) -> None:
        self._f = safe_open(path, framework=framework)

    def __enter__(self):
        self._inner = self._f.__enter__()
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)

    def keys(self):
        return self._inner.keys()

    def get_slice(self, name):
        return self._inner.get_slice(name)

    def get_tensor(self, name):
        _Recording.whole.append(name)
        return self._inner.get_tensor(name)


@pytest.mark.parametrize(("rank", "world", "family", "overrides"), [
    (1, 2, "qwen2", {}),  # bias on q/k/v, 2 KV heads split
    (3, 4, "llama", {"vocab_size": 385}),  # 2 KV heads over 4 ranks (copies), a padded vocabulary share
])  # fmt: skip
def test_a_rank_loads_only_its_slices(tmp_path: Path, monkeypatch, rank: int, world: int, family: str, overrides) -> None:
    path = make_model(tmp_path / "m", family, "tiny", seed=1, **overrides)
    mc = ModelConfig.from_dir(path)
    set_tp(TPGroup(rank, world, None, None))
    try:
        with torch.device("meta"):
            model = build_model(mc)
        model = model.to_empty(device="cpu")
        model.tie_weights()
        monkeypatch.setattr(loader, "safe_open", _Recording)
        _Recording.whole = []
        loader.load_weights(model, path, show_progress=False)
        shards = tp_shards(model)
    finally:
        set_tp(None)
    full = {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(f).items()}
    assert shards and not set(_Recording.whole) & set(shards)  # sharded tensors: slices only
    assert all(n.endswith("norm.weight") for n in _Recording.whole)  # only replicated norms read whole
    params = dict(model.named_parameters())
    for name, (dim, start, length) in shards.items():
        if name not in full:
            continue  # tied lm_head
        want = full[name].narrow(dim, start, length)
        got = params[name].detach().narrow(dim, 0, length)
        assert torch.equal(got, want), name
        assert torch.count_nonzero(params[name].detach().narrow(dim, length, params[name].shape[dim] - length)) == 0
    attn = model.model.layers[0].self_attn
    assert attn.num_heads == 4 // world
    kv_start = shards["model.layers.0.self_attn.k_proj.weight"][1] // mc.head_dim
    assert kv_start == (rank if world <= 2 else rank // 2)  # rank 3 of 4 holds a copy of KV head 1
