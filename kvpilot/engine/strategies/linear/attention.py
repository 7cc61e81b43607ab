"""attention="linear" on a softmax checkpoint: Performer features + an exact recent window.

Each converted layer keeps the paged KV cache as before (the window is read from it) and a summary
per sequence in the state pool: per KV head `[m, Dv + 1]` = (sum phi(k) v^T | sum phi(k)) over every
token older than the window. A query at position t weighs keys in (t - W, t] exactly,
exp(scale q.k), and older keys by phi(q).phi(k) (strategies/linear/features.py: positive orthogonal random
features, unbiased for exp(scale q.k)); one normalisation combines both. With W >= the context the
layer is exact softmax attention. After a chunk [s, e) the summary holds positions < e - W + 1.

Decode steps (one new token per sequence) run batched over every decoding sequence with no host
sync (`_decode_batched`): one indexed gather of each sequence's window K/V from the paged cache via
the step's block tables, a mask for positions before the sequence's start, the exact-window and
summary parts combined with batched einsums, and the key leaving the window folded into every
sequence's summary with one `index_add_` into the state pool. Prefill chunks, and decodes of sequences
moved to the exact path, go through the per-sequence torch loop (`_attend`), which is also the
reference the batched decode is tested against (`batched_decode = False` routes decodes there too).
The window's K/V are gathered from the paged cache, which by default still holds every token.
"""

from __future__ import annotations

import math

import torch

from kvpilot.engine.context import Context, get_context
from kvpilot.engine.kernels import store_kvcache
from kvpilot.engine.layers.attention import Attention


class PerformerAttention(Attention):
    """Softmax attention replaced by exact-window + random-feature summary, same paged KV cache."""

    def __init__(self, base: Attention, window: int, features: torch.Tensor) -> None:
        super().__init__(base.num_heads, base.num_kv_heads, base.head_dim, base.scale)
        self.k_cache, self.v_cache = base.k_cache, base.v_cache
        self.window = window
        self.features = features  # [Hkv, m, D] fp32, a plain attribute (drawn from a seed, not loaded)
        self.num_features = features.shape[1]
        self.state_pool = torch.empty(0)
        self.force_exact = False  # dense passes attend exactly (runtime validation's reference)
        self.batched_decode = True  # False: decodes through the per-sequence loop (the reference)

    @property
    def state_shape(self) -> tuple[int, int, int]:
        """One sequence's summary in this layer: [Hkv, m, Dv + 1] (kv | z)."""
        return (self.num_kv_heads, self.num_features, self.head_dim + 1)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_context()
        if self.features.device != q.device:
            self.features = self.features.to(q.device)
        w = self.features
        if ctx.dense and self.force_exact:
            return self._dense_causal(q, k, v)
        if ctx.dense:
            state = torch.zeros(self.state_shape, dtype=torch.float32, device=q.device)
            return self._attend(q, k.float(), v.float(), 0, 0, state, w).to(q.dtype)
        store_kvcache(
            k.to(self.k_cache.dtype), v.to(self.v_cache.dtype), self.k_cache, self.v_cache, ctx.slot_mapping
        )
        n_prefill = ctx.num_prefill_tokens
        num_prefill_seqs = ctx.context_lens.shape[0] if n_prefill else 0
        num_decodes = q.shape[0] - n_prefill
        exact_flags = list(ctx.linear_exact or [])
        exact_flags += [False] * (num_prefill_seqs + num_decodes - len(exact_flags))
        decode_exact = exact_flags[num_prefill_seqs:]
        # decodes of sequences moved to the exact path attend through the per-sequence loop
        batched = self.batched_decode and not all(decode_exact)
        if batched and n_prefill == 0 and not any(decode_exact):
            return self._decode_batched(
                q, ctx.decode_block_tables, ctx.decode_context_lens, ctx.decode_linear_slots, w
            ).to(q.dtype)
        out = torch.empty_like(q)
        loop_decodes = not batched or any(decode_exact)  # reading decode tables on the host syncs
        for i, (row, start, length, slot, table) in enumerate(_sequences(ctx, q.shape[0], loop_decodes)):
            # a sequence moved to the exact path (runtime validation) attends to every cached token
            exact = exact_flags[i]
            if batched and row >= n_prefill and not exact:
                continue  # attended below, with the other decodes
            window = start + length if exact else self.window
            state = torch.zeros_like(self.state_pool[slot]) if exact else self.state_pool[slot]
            key_lo = max(0, start - window + 1)
            keys, values = self._gather(table, key_lo, start + length)
            out[row : row + length] = self._attend(
                q[row : row + length], keys, values, key_lo, start, state, w, window
            ).to(q.dtype)
        if batched:
            rows = [j for j in range(num_decodes) if not decode_exact[j]]
            tables, lens, slots = ctx.decode_block_tables, ctx.decode_context_lens, ctx.decode_linear_slots
            if len(rows) < num_decodes:
                index = torch.tensor(rows, dtype=torch.long).to(q.device, non_blocking=True)
                tables, lens, slots = tables[index], lens[index], slots[index]
                out[n_prefill + index] = self._decode_batched(
                    q[n_prefill + index], tables, lens, slots, w
                ).to(q.dtype)
            else:
                out[n_prefill:] = self._decode_batched(q[n_prefill:], tables, lens, slots, w).to(q.dtype)
        return out

    def _decode_batched(
        self,
        q: torch.Tensor,
        tables: torch.Tensor,
        context_lens: torch.Tensor,
        slots: torch.Tensor,
        w: torch.Tensor,
    ) -> torch.Tensor:
        """One query per sequence at position context_len - 1, all sequences at once -> [B, Hq, D] fp32.

        q [B, Hq, D]; tables [B, max_blocks] (-1 padded); context_lens, slots [B]. The query attends
        exactly to the keys at (t - W, t] and to the summary; then the key at t - W + 1 (the one that
        leaves the window for the next query) is folded into the sequence's summary.
        """
        batch, hkv, d = q.shape[0], self.num_kv_heads, self.head_dim
        group = self.num_heads // hkv
        bs = self.k_cache.shape[1]
        # a window wider than the table can hold reads at most the table's capacity (every position)
        span = min(self.window, tables.shape[1] * bs)
        pos = (context_lens.long() - span)[:, None] + torch.arange(span, device=q.device)  # [B, span]
        valid = pos >= 0
        pos = pos.clamp_min(0)  # masked below; position 0 is always in the table
        blocks = tables.long().gather(1, torch.div(pos, bs, rounding_mode="floor"))
        cache_slots = blocks * bs + pos % bs  # [B, span]
        # rows of the cache viewed [slots * Hkv, D], ordered [B, Hkv, span]: the window lands in the
        # layout the batched matmuls read, with no permute copy
        rows = (cache_slots[:, None, :] * hkv + torch.arange(hkv, device=q.device)[:, None]).reshape(-1)
        k = self.k_cache.view(-1, d).index_select(0, rows).view(batch, hkv, span, d).float()
        v = self.v_cache.view(-1, d).index_select(0, rows).view(batch, hkv, span, d).float()
        qf = q.float().view(batch, hkv, group, d)
        logits = torch.matmul(qf, k.transpose(2, 3)) * self.scale  # [B, Hkv, G, span]
        logits = logits.masked_fill(~valid[:, None, None, :], float("-inf"))
        lq = _log_features(qf, w, self.scale, "bkgd,kmd->bkgm")  # [B, Hkv, G, m]
        slots = slots.long()  # index_select is several times slower with int32 indices on a CPU
        state = self.state_pool.index_select(0, slots)  # [B, Hkv, m, Dv + 1]
        shift = torch.maximum(logits.amax(dim=3), lq.amax(dim=3))[..., None]  # [B, Hkv, G, 1]
        p = (logits - shift).exp()
        num_den = torch.matmul((lq - shift).exp(), state)  # [B, Hkv, G, Dv + 1]
        num = torch.matmul(p, v) + num_den[..., :-1]
        den = p.sum(dim=3) + num_den[..., -1]
        out = (num / den[..., None]).reshape(batch, self.num_heads, d)
        if span == self.window:  # fold the key at t - W + 1 where it exists (t - W + 1 >= 0)
            phi = _log_features(k[:, :, 0], w, self.scale, "bkd,kmd->bkm").exp()  # [B, Hkv, m]
            phi = phi.masked_fill(~valid[:, :1, None], 0.0)
            v_one = torch.cat((v[:, :, 0], torch.ones_like(v[:, :, 0, :1])), dim=-1)  # [B, Hkv, Dv + 1]
            self.state_pool.index_add_(0, slots, phi[..., None] * v_one[:, :, None, :])
        return out

    def _gather(self, table: list[int], lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        bs = self.k_cache.shape[1]
        slots = torch.tensor(
            [table[p // bs] * bs + p % bs for p in range(lo, hi)], device=self.k_cache.device
        )
        k = self.k_cache.reshape(-1, self.num_kv_heads, self.head_dim)[slots]
        v = self.v_cache.reshape(-1, self.num_kv_heads, self.head_dim)[slots]
        return k.float(), v.float()

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_lo: int,
        start: int,
        state: torch.Tensor,
        w: torch.Tensor,
        window: int | None = None,
    ) -> torch.Tensor:
        """Queries at positions start.. over keys at key_lo.. (through the query's own) and the summary
        in `state` (updated in place with the keys that leave the window) -> [n, Hq, D] fp32."""
        window = self.window if window is None else window
        group = self.num_heads // self.num_kv_heads
        n, length = q.shape[0], k.shape[0]
        qf = q.float()
        lq = _log_features(qf, w.repeat_interleave(group, 0), self.scale)  # [n, Hq, m]
        lk = _log_features(k, w, self.scale)  # [L, Hkv, m]
        kq = k.repeat_interleave(group, 1)
        vq = v.repeat_interleave(group, 1)
        exact = torch.einsum("nhd,lhd->hnl", qf, kq) * self.scale
        lk_max = lk.amax(dim=(0, 2), keepdim=True)  # per KV head: shift before leaving log space
        lq_max = lq.amax(dim=2, keepdim=True)
        dots = torch.einsum(
            "nhm,lhm->hnl", (lq - lq_max).exp(), (lk - lk_max).exp().repeat_interleave(group, 1)
        )
        approx = dots.log() + lq_max.permute(1, 0, 2) + lk_max.repeat_interleave(group, 1).permute(1, 0, 2)
        age = (start + torch.arange(n, device=q.device))[:, None] - (
            key_lo + torch.arange(length, device=q.device)
        )
        logits = torch.where(age < window, exact, approx).masked_fill(age < 0, float("-inf"))
        summary = state.repeat_interleave(group, 0)  # [Hq, m, Dv + 1]
        shift = torch.maximum(logits.amax(dim=2), lq.amax(dim=2).transpose(0, 1))  # [Hq, n]
        p = (logits - shift[:, :, None]).exp()
        phi_q = (lq.transpose(0, 1) - shift[:, :, None]).exp()  # [Hq, n, m]
        num_den = torch.einsum("hnm,hmv->hnv", phi_q, summary)
        num = torch.einsum("hnl,lhv->hnv", p, vq) + num_den[:, :, :-1]
        den = p.sum(dim=2) + num_den[:, :, -1]
        self._fold(state, k, v, lk, key_lo, start + n, window)
        return (num / den[:, :, None]).transpose(0, 1)

    def _fold(
        self,
        state: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        lk: torch.Tensor,
        key_lo: int,
        end: int,
        window: int,
    ) -> None:
        """Add the keys leaving the window after position end - 1 (positions < end - W + 1) to the summary."""
        first, last = key_lo, max(0, end - window + 1)  # the summary held positions < key_lo
        if last <= first:
            return
        rows = slice(first - key_lo, last - key_lo)
        phi = lk[rows].exp()  # [N, Hkv, m]
        state[:, :, :-1] += torch.einsum("nhm,nhv->hmv", phi, v[rows])
        state[:, :, -1] += phi.sum(dim=0)


def _log_features(x: torch.Tensor, w: torch.Tensor, scale: float, spec: str = "nhd,hmd->nhm") -> torch.Tensor:
    """log phi(x) per head: x [N, H, d], w [H, m, d] -> [N, H, m] (strategies/linear/features.py, per head);
    `spec` contracts other layouts of x whose last dimension is d (e.g. [B, Hkv, G, d])."""
    xs = x * math.sqrt(scale)
    return torch.einsum(spec, xs, w) - 0.5 * (xs * xs).sum(-1, keepdim=True) - 0.5 * math.log(w.shape[1])


def _sequences(
    ctx: Context, num_tokens: int, with_decodes: bool = True
) -> list[tuple[int, int, int, int, list[int]]]:
    """(first packed row, first position, tokens, state slot, block table) of every sequence this step
    (prefill chunks only, and no host sync for the decodes, when with_decodes is False)."""
    seqs: list[tuple[int, int, int, int, list[int]]] = []
    row = 0
    if ctx.num_prefill_tokens:
        cu = ctx.cu_seqlens_q.tolist()
        for b, (ctx_len, slot, table) in enumerate(
            zip(ctx.context_lens.tolist(), ctx.linear_slots.tolist(), ctx.block_tables.tolist(), strict=True)
        ):
            length = cu[b + 1] - cu[b]
            seqs.append((row, ctx_len - length, length, slot, table))
            row += length
    if row < num_tokens and with_decodes:
        for ctx_len, slot, table in zip(
            ctx.decode_context_lens.tolist(),
            ctx.decode_linear_slots.tolist(),
            ctx.decode_block_tables.tolist(),
            strict=True,
        ):
            seqs.append((row, ctx_len - 1, 1, slot, table))
            row += 1
    return seqs
