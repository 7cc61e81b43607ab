"""RMSNorm, optionally fused with the residual add before it: one read and one write per row."""
