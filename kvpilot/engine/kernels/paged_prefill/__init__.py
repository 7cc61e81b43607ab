"""Paged prefill attention: causal varlen chunks over cached prefix + new chunk."""
