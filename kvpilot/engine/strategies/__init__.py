"""One package per memory strategy: its math, its layer, its load-time transform and its runtime check.

`gqa/` (mean-pooled KV heads), `mla/` (a shared K/V latent), `linear/` (Performer features + exact
window), `kv_quant/` (int8 / fp8 caches, auto switching), `eviction/` (sinks + window, ladder).
The torch-free knobs and refused combinations of all of them live in config/strategy.py.
"""
