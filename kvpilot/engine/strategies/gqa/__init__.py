"""GQA: merge KV heads by mean-pooling at load (convert.py); no runtime check (the conversion is exact to its weights)."""
