"""kvpilot: LLM inference fleets on Kubernetes with the KV cache as the first-class concern."""

__version__ = "0.1.0"
