"""`kvpilot bench`: the offline throughput workload and an OpenAI-compatible serving load generator."""
