"""Megatron-style tensor-parallel layers, and factories that give plain torch layers at one rank.

A column-parallel linear holds a slice of the output rows, a row-parallel one a slice of the input
columns and sums its partial outputs over the ranks (one all-reduce); the embedding and LM head hold a
slice of the vocabulary. Each records its slice in `tp_shard` ({param name: (dim, start, length)}) so
the loader reads only those rows or columns from the safetensors files.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvpilot.engine.parallel.shard import even_split, vocab_split
from kvpilot.engine.parallel.state import all_reduce, gather_last_dim, tp_rank, tp_world


class ColumnParallelLinear(nn.Linear):
    """y[:, start:start+length] of a Linear(in_features, out_features): rows of the weight (and bias)."""

    def __init__(self, in_features: int, start: int, length: int, bias: bool) -> None:
        super().__init__(in_features, length, bias=bias)
        self.tp_shard = {"weight": (0, start, length), **({"bias": (0, start, length)} if bias else {})}


class RowParallelLinear(nn.Linear):
    """x[:, start:start+length] @ W[:, start:start+length].T summed over ranks; the bias after the sum."""

    def __init__(self, start: int, length: int, out_features: int, bias: bool) -> None:
        super().__init__(length, out_features, bias=bias)
        self.tp_shard = {"weight": (1, start, length)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = all_reduce(F.linear(x, self.weight))
        return out + self.bias if self.bias is not None else out


class VocabParallelEmbedding(nn.Embedding):
    """Rows [start, start+length) of the embedding (padded to an even share); other ids give zeros,
    and the sum over ranks is the full lookup."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        start, length, padded = vocab_split(vocab_size, tp_rank(), tp_world())
        super().__init__(padded, hidden_size)
        self.vocab_start, self.vocab_length = start, length
        self.tp_shard = {"weight": (0, start, length)}

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.vocab_start
        inside = (local >= 0) & (local < self.vocab_length)
        out = F.embedding(torch.where(inside, local, 0), self.weight) * inside.unsqueeze(-1).to(
            self.weight.dtype
        )
        return all_reduce(out)


class ParallelLMHead(nn.Linear):
    """The LM head's vocabulary slice; logits are gathered on rank 0 and cut to the real vocabulary."""

    def __init__(self, hidden_size: int, vocab_size: int) -> None:
        start, length, padded = vocab_split(vocab_size, tp_rank(), tp_world())
        super().__init__(hidden_size, padded, bias=False)
        self.vocab_size = vocab_size
        self.tp_shard = {"weight": (0, start, length)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gather_last_dim(F.linear(x, self.weight))[..., : self.vocab_size]


def column_linear(
    in_features: int, out_features: int, bias: bool, start: int = 0, length: int | None = None
) -> nn.Linear:
    """nn.Linear at one rank; else this rank's rows [start, start+length) (default: an even share)."""
    if tp_world() == 1:
        return nn.Linear(in_features, out_features, bias=bias)
    if length is None:
        start, length = even_split(out_features, tp_rank(), tp_world())
    return ColumnParallelLinear(in_features, start, length, bias)


def row_linear(
    in_features: int, out_features: int, bias: bool, start: int = 0, length: int | None = None
) -> nn.Linear:
    """nn.Linear at one rank; else this rank's input columns [start, start+length), all-reduced."""
    if tp_world() == 1:
        return nn.Linear(in_features, out_features, bias=bias)
    if length is None:
        start, length = even_split(in_features, tp_rank(), tp_world())
    return RowParallelLinear(start, length, out_features, bias)


def embedding(vocab_size: int, hidden_size: int) -> nn.Embedding:
    return (
        nn.Embedding(vocab_size, hidden_size)
        if tp_world() == 1
        else VocabParallelEmbedding(vocab_size, hidden_size)
    )


def lm_head(hidden_size: int, vocab_size: int) -> nn.Linear:
    if tp_world() == 1:
        return nn.Linear(hidden_size, vocab_size, bias=False)
    return ParallelLMHead(hidden_size, vocab_size)


def tp_shards(model: nn.Module) -> dict[str, tuple[int, int, int]]:
    """{parameter name: (dim, start, length)} of every sharded parameter (empty at one rank)."""
    return {
        f"{prefix}.{name}" if prefix else name: spec
        for prefix, module in model.named_modules()
        for name, spec in getattr(module, "tp_shard", {}).items()
    }


class MergedLinear:
    """Linears that read the same input as one GEMM (q/k/v, gate/up): their weights become row blocks of one
    tensor, so loading, tensor-parallel slicing and strategies that rewrite a projection in place (GQA
    merging and compensation, MLA and Performer conversion read or copy `k_proj.weight`) see the linears as
    before, and the merged GEMM sees what they wrote.

    A linear whose parameter was replaced rather than written (`module.to(...)`, a new nn.Parameter) is
    noticed at the next call, which merges again. Not an nn.Module: the merged tensors are not parameters
    a second time (weights_bytes, named_parameters and the loader count each once).
    """

    def __init__(self, linears: list[nn.Linear]) -> None:
        if len({lin.bias is None for lin in linears}) != 1:
            raise ValueError("merged linears must all have a bias or all have none")
        self.linears = linears
        self.widths = [lin.weight.shape[0] for lin in linears]  # this rank's rows of each
        self.weight, self.bias = self._merge()

    def _merge(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        with torch.no_grad():
            weight = torch.cat([lin.weight for lin in self.linears])
            bias = None if self.linears[0].bias is None else torch.cat([lin.bias for lin in self.linears])
        at = 0
        for lin, width in zip(self.linears, self.widths, strict=True):
            lin.weight = nn.Parameter(weight[at : at + width], requires_grad=False)
            if bias is not None:
                lin.bias = nn.Parameter(bias[at : at + width], requires_grad=False)
            at += width
        return weight, bias

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each linear's output, as views of the one GEMM's [T, sum of widths]."""
        return self.joined(x).split(self.widths, dim=-1)

    def joined(self, x: torch.Tensor) -> torch.Tensor:
        """The one GEMM's output [T, sum of widths], the linears' outputs side by side."""
        if any(lin.weight.data_ptr() != self._row_ptr(i) for i, lin in enumerate(self.linears)):
            self.weight, self.bias = self._merge()
        return F.linear(x, self.weight, self.bias)

    def _row_ptr(self, index: int) -> int:
        return self.weight.data_ptr() + sum(self.widths[:index]) * self.weight.stride(0) * self.weight.element_size()
