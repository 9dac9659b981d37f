"""Kernel-key fields as plain data: the field names, the identifier string, and :func:`trusted` construction.

Kept free of Pydantic so expansion and registry writing (tens of thousands of kernels) run without
building model objects; :mod:`fmha_dsl.keys` defines the models over the same field names, and
:mod:`fmha_dsl.keyfields` holds a kernel's fields with its model built on first use.
"""

from __future__ import annotations

import functools

# field names of Signature and Algorithm, in model order (tests check them against the models)
SIG_KEYS = ("family", "dtype", "mode", "vlayout", "hdim_q", "hdim_v", "mask", "bias", "lse", "dropout", "qscale",
            "rope", "logits", "paged_kv", "fp8_static_quant", "skip", "sink", "dbias", "store_randval",
            "deterministic", "kv_layout", "kv_lookup", "page_size")
ALG_KEYS = ("pipeline", "tile", "wave", "warp", "pad_s", "pad_sk", "pad_d", "pad_dv", "trload", "kv64",
            "hdim_q_alignment", "hdim_v_alignment", "block_per_cu", "num_wave_groups", "max_splits_log2",
            "max_seq_len_q", "selection_rank", "constraint")


@functools.lru_cache(maxsize=4096)
def _x(t) -> str:
    return "x".join(map(str, t))


def trusted(cls, fields: dict):
    """Build a frozen key part from values the rule engine already canonicalised (no validation).

    ``fields`` must hold every field of ``cls``; tests check that such values re-validate equal.
    """
    m = cls.__new__(cls)
    object.__setattr__(m, "__dict__", fields)
    object.__setattr__(m, "__pydantic_fields_set__", set(fields))
    object.__setattr__(m, "__pydantic_extra__", None)
    object.__setattr__(m, "__pydantic_private__", None)
    return m


def identifier_from(s: dict, a: dict, arch: str) -> str:
    """Readable, collision-free key string: every field of the key, in a fixed order."""
    b = _BIT
    return (
        f"fmha_{s['family']}_{s['dtype']}_{s['mode']}_v{s['vlayout']}_hq{s['hdim_q']}_hv{s['hdim_v']}"
        f"_m{s['mask']}_b{s['bias']}_lse{b[s['lse']]}_do{b[s['dropout']]}_qs{s['qscale']}_rp{s['rope']}"
        f"_lg{b[s['logits']]}_pkv{b[s['paged_kv']]}_sq{b[s['fp8_static_quant']]}_sk{b[s['skip']]}"
        f"_sink{b[s['sink']]}_db{b[s['dbias']]}_sr{b[s['store_randval']]}_det{b[s['deterministic']]}"
        f"_km{s['kv_layout']}_kl{s['kv_lookup']}_ps{s['page_size']}"
        f"_p{a['pipeline']}_t{_x(a['tile'])}_w{_x(a['wave'])}_wt{_x(a['warp'])}"
        f"_pad{a['pad_s']}{a['pad_sk']}{a['pad_d']}{a['pad_dv']}_tr{b[a['trload']]}_k64{b[a['kv64']]}"
        f"_aq{a['hdim_q_alignment']}_av{a['hdim_v_alignment']}_bpc{a['block_per_cu']}_wg{a['num_wave_groups']}"
        f"_ms{a['max_splits_log2']}_mq{a['max_seq_len_q']}_r{a['selection_rank']}"
        f"_c{a['constraint']}_{arch}"
    )


_BIT = {False: "0", True: "1"}
