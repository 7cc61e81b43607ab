"""Paged decode attention: GQA-aware split-K flash-decoding with a reduction."""
