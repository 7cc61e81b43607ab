"""The kopf operator that reconciles InferenceService objects. Never imports torch."""
