"""Model delivery: fetch a checkpoint from oci://, s3:// or hf:// into a volume before the engine starts.

`kvpilot storage-init` (init.py) is the engine pod's init container: it fetches the served files
(weights, config, tokenizer, chat template) into a node-local cache keyed by the lineage digest,
verifies that digest, and leaves a complete directory or nothing. The operator imports
`read_config` (config.py) to plan capacity from the source's own config.json. Torch-free.
"""
