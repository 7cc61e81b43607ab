"""Rotate-half RoPE of packed q and k at given positions, cos/sin computed in the kernel."""
