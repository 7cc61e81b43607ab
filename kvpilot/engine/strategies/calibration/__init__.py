"""Calibration for load-time conversions: tokens from a user's text, and each layer's attention input on them."""
