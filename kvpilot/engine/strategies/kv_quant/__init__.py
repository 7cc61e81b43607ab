"""KV quantisation: int8 / fp8 caches (layer.py), 16-bit/int8 pools of kv_cache_dtype=auto (pools.py), runtime check (check.py)."""
