"""Attention layers over the paged KV cache: K/V (attention.py) and an MLA latent (latent_attention.py)."""
