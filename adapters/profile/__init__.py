"""Measurement on real hardware for `gbmw profile` (needs torch): one technique per file."""
