"""y = x @ w.T for the decode batch sizes cuBLAS tiles poorly (M of tens to a few hundred rows)."""
