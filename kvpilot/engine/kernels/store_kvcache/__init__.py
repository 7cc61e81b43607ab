"""KV-cache write: rows of K/V into paged blocks by slot mapping."""
