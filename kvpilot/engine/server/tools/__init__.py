"""Tool calling: what a request's tools ask for, how the output is constrained, and how it is read back as calls."""
