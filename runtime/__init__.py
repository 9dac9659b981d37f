"""Installed as ``fmha_dsl.runtime``: what executes kernels (loading binaries, launching, dispatch).

Filled by the build/dispatch stage; it may import only fmha_dsl.keys, registry and errors.
"""
