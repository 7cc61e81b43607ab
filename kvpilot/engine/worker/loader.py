"""Load HF safetensors weights into a model: verify SHA256 digests, then copy with a progress bar.

Under tensor parallelism each rank reads only its slice of a sharded parameter (`safe_open(...).get_slice`,
the slices the parallel layers name in `tp_shard`): no rank materialises the whole model.

A checkpoint tensor with no parameter in the model is an error, unless the model names a reason to
skip it (`model.checkpoint_skip_reason(name)`, e.g. DeepSeek-V3's multi-token-prediction layers);
skipped tensors are counted and logged once per reason, never read.

Mixture-of-experts layers stack their experts (models/moe.StackedExperts: w13 [E, 2I, H], w2
[E, H, I]); a per-expert checkpoint tensor (`...experts.{e}.gate_proj.weight`, MiniMax's `w1`)
is copied into its slice of the stacked parameter, which counts as loaded once every slice is.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from kvpilot.checkpoint_digest import file_sha256
from kvpilot.engine.layers.parallel import tp_shards
from kvpilot.engine.models.moe import stacked_piece

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# MiniMax checkpoints also store lightning attention's decay tables (recomputed from the config)
IGNORED_SUFFIXES = (
    "rotary_emb.inv_freq",
    "self_attn.slope_rate",
    "self_attn.query_decay",
    "self_attn.key_decay",
    "self_attn.diagonal_decay",
)
DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2}
log = logging.getLogger("kvpilot.engine.worker.loader")


class WeightIntegrityError(ValueError):
    """A weight file's SHA256 digest does not match the one it was pinned to."""


def weight_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of an HF model directory (sharded through the index, or single)."""
    root = Path(model_dir)
    index = root / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (root / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{index} names shard(s) {missing} that are not in {root}")
        return [root / n for n in names]
    if (root / SINGLE_FILE).is_file():
        return [root / SINGLE_FILE]
    found = sorted(root.glob("*.safetensors"))
    if found:
        return found
    raise FileNotFoundError(f"no weights in {root}: expected {SINGLE_FILE}, or shards listed in {INDEX_FILE}")


sha256_file = file_sha256  # one implementation, shared with `kvpilot digest` (torch-free)


def verify_sha256(model_dir: str | Path, expected: dict[str, str]) -> None:
    """Refuse to load when a pinned file is missing or its digest differs."""
    root = Path(model_dir)
    for name, want in sorted(expected.items()):
        path = root / name
        if not path.is_file():
            raise WeightIntegrityError(
                f"weight file {name!r} is pinned to sha256 {want} but is missing from {root}"
            )
        got = sha256_file(path)
        if got.lower() != want.lower().removeprefix("sha256:"):
            raise WeightIntegrityError(
                f"weight file {name!r} failed verification: expected sha256 {want}, got {got}; refusing to load"
            )


def load_weights(
    model: nn.Module,
    model_dir: str | Path,
    sha256: dict[str, str] | None = None,
    show_progress: bool = True,
    transform: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> int:
    """Copy every tensor of the checkpoint into model's parameters; return the bytes loaded.

    `transform(name, tensor)` may rewrite a tensor before the shape check (GQA conversion)."""
    if sha256:
        verify_sha256(model_dir, sha256)
    params = dict(model.named_parameters(remove_duplicate=False))
    shards = tp_shards(model)  # {} at one rank
    skip_reason: Callable[[str], str | None] = getattr(model, "checkpoint_skip_reason", lambda _: None)
    skipped_tensors: Counter[str] = Counter()
    skipped_bytes: Counter[str] = Counter()
    loaded: set[str] = set()
    stacked: Counter[str] = Counter()  # elements copied into each stacked-expert parameter
    total = 0
    files = weight_files(model_dir)
    with tqdm(desc="loading weights", unit="tensor", disable=not show_progress) as bar:
        for path in files:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    if name.endswith(IGNORED_SUFFIXES):
                        continue
                    piece = stacked_piece(model, name) if name not in params else None
                    if piece is not None:
                        tensor = f.get_tensor(name)
                        _copy_checked(path.name, name, tensor, params[piece.param][piece.index])
                        stacked[piece.param] += tensor.numel()
                        total += tensor.numel() * tensor.element_size()
                        bar.update(1)
                        continue
                    if name not in params:
                        reason = skip_reason(name)
                        if reason is None:
                            raise ValueError(
                                f"{path.name}: tensor {name!r} has no matching parameter in the "
                                f"{type(model).__name__} built from {model_dir}/config.json; a checkpoint "
                                "may hold only the model's parameters (check config.json matches the weights)"
                            )
                        skipped_tensors[reason] += 1
                        skipped_bytes[reason] += stored_bytes(f.get_slice(name))
                        continue
                    shard = shards.get(name)
                    whole = shard is None or _transformed(transform, name)
                    tensor = f.get_tensor(name) if whole else read_slice(f.get_slice(name), *shard)
                    if transform is not None:
                        tensor = transform(name, tensor)
                    if whole and shard is not None:  # a converted tensor (GQA pooling) is sliced after it
                        tensor = tensor.narrow(*shard)
                    param = params[name]
                    target = param if shard is None else param.narrow(shard[0], 0, shard[2])
                    if tuple(tensor.shape) != tuple(target.shape):
                        raise ValueError(
                            f"{path.name}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                            f"the model expects {tuple(target.shape)}"
                        )
                    with torch.no_grad():
                        if target.shape != param.shape:  # the last rank's vocabulary padding
                            param.zero_()
                        target.copy_(tensor)
                    loaded.add(name)
                    total += tensor.numel() * tensor.element_size()
                    bar.update(1)
    for reason, count in skipped_tensors.items():
        log.info(
            "skipped %d checkpoint tensors (%d bytes, %.1f MiB) of %s: %s",
            count,
            skipped_bytes[reason],
            skipped_bytes[reason] / 2**20,
            model_dir,
            reason,
        )
    loaded |= {n for n, count in stacked.items() if count == params[n].numel()}
    tied = {n for n, p in params.items() if any(p is params[m] for m in loaded)}
    missing = sorted(set(params) - loaded - tied)
    if missing:
        raise ValueError(
            f"checkpoint in {model_dir} lacks parameters {missing[:5]}{'...' if len(missing) > 5 else ''}"
        )
    return total


def _copy_checked(file: str, name: str, tensor: torch.Tensor, target: torch.Tensor) -> None:
    if tuple(tensor.shape) != tuple(target.shape):
        raise ValueError(
            f"{file}: tensor {name!r} has shape {tuple(tensor.shape)}, the model expects {tuple(target.shape)}"
        )
    with torch.no_grad():
        target.copy_(tensor)


def _transformed(transform: Callable[[str, torch.Tensor], torch.Tensor] | None, name: str) -> bool:
    """Whether the load transform rewrites this tensor (it then needs the whole of it)."""
    if transform is None:
        return False
    touches = getattr(transform, "touches", None)
    return True if touches is None else bool(touches(name))


def read_slice(tensor_slice, dim: int, start: int, length: int) -> torch.Tensor:
    """Rows (dim 0) or columns (dim 1) [start, start+length) of a safetensors tensor, read alone."""
    index = [slice(None)] * len(tensor_slice.get_shape())
    index[dim] = slice(start, start + length)
    return tensor_slice[tuple(index)]


def stored_bytes(tensor_slice) -> int:
    """Bytes of a safetensors tensor from its header (shape, dtype), without reading it."""
    numel = 1
    for dim in tensor_slice.get_shape():
        numel *= dim
    return numel * DTYPE_BYTES.get(tensor_slice.get_dtype(), 1)


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Random weights in place of a checkpoint (`load_format="dummy"`: benchmarks of a model's shape).

    Matrices ~ N(0, 1/fan_in) so activations keep their scale through the layers, norm weights
    ~ 1 + N(0, 0.1^2), other vectors (biases) ~ N(0, 0.1^2); drawn on the model's device.
    """
    params = list(model.named_parameters())
    if not params:
        return
    gen = torch.Generator(device=params[0][1].device).manual_seed(seed)
    for name, param in params:
        if param.dim() >= 2:
            param.normal_(0.0, param.shape[-1] ** -0.5, generator=gen)
        elif "norm" in name:
            param.normal_(1.0, 0.1, generator=gen)
        else:
            param.normal_(0.0, 0.1, generator=gen)
