"""Engine statistics: the feed builder (stats.py), sampled head utilisation, and the torch-free feed contract the sidecar imports."""
