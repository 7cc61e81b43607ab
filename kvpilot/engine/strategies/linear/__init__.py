"""Linear attention: Performer random features (features.py), the converted layer (attention.py), runtime check.py."""
