"""The InferenceService's status: conditions, the document built from decisions, its writer, pod blockers."""
