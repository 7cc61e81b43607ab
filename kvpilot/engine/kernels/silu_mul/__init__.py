"""silu(gate) * up, the SwiGLU MLP's elementwise middle, in one pass."""
