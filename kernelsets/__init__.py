"""Installed as ``fmha_dsl.kernelsets``: curated .fmha kernel sets shipped with the package (data only)."""
