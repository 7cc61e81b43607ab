"""Reconciliation of an InferenceService into its children: preflight, the stable track, lineage."""
