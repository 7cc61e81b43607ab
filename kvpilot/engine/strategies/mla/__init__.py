"""MLA: native DeepSeek latent or SVD conversion of K/V (svd.py, decode.py), the converted layer (attention.py), load-time apply.py, runtime check.py."""
