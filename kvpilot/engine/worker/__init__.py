"""The device: the ModelRunner and what it owns (inputs, KV cache, state cache, memory, CUDA graphs, loader, sampler, scoring)."""
