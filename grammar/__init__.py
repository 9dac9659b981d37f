"""Installed as ``fmha_dsl.grammar``: the Lark grammar of the .fmha language (data only)."""
