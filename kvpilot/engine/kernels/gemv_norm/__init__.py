"""A small-batch linear layer with what follows it fused in: y = x @ W.T, then the residual add and
the next RMSNorm, optionally with silu(gate) * up formed from x on load (the MLP's down projection).

At batch 1 a decoder layer's o_proj and down_proj are weight-streaming GEMVs followed by two tiny
launches each (cuBLAS's split-K reduction, the fused add + RMSNorm); here one launch does all of it:
programs over (weight rows, K splits) write fp32 partial rows, and the last program to finish a row
(an atomic ticket) reduces the partials and runs the add + norm epilogue (rmsnorm/kernel.add_rmsnorm_row).
"""

MAX_ROWS = 64  # rows one call takes (the engine fuses steps of a few tokens; EngineConfig.fused_gemv_rows is bounded by it)
