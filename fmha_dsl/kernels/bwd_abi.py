"""The backward family's run-time ABI: plain data and pure functions shared by the templates and the runtime.

Kept free of Triton (the runtime imports it).  The backward runs as CK's three stages:

1. ``bwd_dot_do_o``   ``D[b, h, m] = sum_d dO * O`` (fp32), and the forward's LSE in log2 units, ``L2 = lse *
                      log2(e)`` (``+inf`` for a row that saw no key, so that its ``P = exp2(S - L2)`` is 0): the main
                      stage's loop then reads both as they are   grid ``(cdiv(Sq, DOT_BLOCK_M), Hq, B)``
2. ``bwd_dq_dk_dv``   one program per (key block, K/V head, batch): dK, dV for its keys (summed over the query
                      heads of a GQA group) and dQ accumulated by atomics in the fp32 workspace ``dq_acc``
                      ``[B, Hq, Sq, Dq]``.  ``deterministic``: no atomics; the grid gets ``cdiv(Sq, BLOCK_N)``
                      more programs, each computing dQ for BLOCK_N query rows over its keys in a fixed order
                      (a fixed-order reduction: bit-identical run to run) and storing it as dQ itself, in the
                      input dtype: no accumulator, no third stage
                      grid ``(cdiv(Sk, BLOCK_N) [+ cdiv(Sq, BLOCK_N)], Hk, B)``
3. ``bwd_convert_dq`` ``dQ = scale * dq_acc`` in the input dtype (atomic dQ only: :func:`converts`; stage 2 adds
                      ``dS K`` unscaled)
                      grid ``(cdiv(Sq, CONVERT_BLOCK_M), Hq, B)``

The workspace (one fp32 buffer, sized from upper bounds alone: batch, heads, max seqlens, head dim -- never from
``cu_seqlens``): ``D`` and ``L2``, each ``[B, Hq, Sq_max]``, then, for atomic dQ, ``dq_acc`` ``[B, Hq, Sq_max, Dq]``,
which must be zero before stage 2 (:func:`workspace`).  Group mode indexes them by each sequence's local row.
"""

from __future__ import annotations

import math

DOT_ARGS: tuple[tuple[str, str], ...] = (
    ("O", "*{dtype}"), ("dO", "*{dtype}"), ("Lse", "*fp32"), ("D", "*fp32"), ("L2", "*fp32"),
    ("cu_seqlens_q", "*i32"), ("seqlen_q", "i32"), ("head_dim_v", "i32"),
    ("stride_ob", "i32"), ("stride_oh", "i32"), ("stride_om", "i32"),
    ("stride_dob", "i32"), ("stride_doh", "i32"), ("stride_dom", "i32"),
    ("stride_lb", "i32"), ("stride_lh", "i32"), ("stride_db", "i32"), ("stride_dh", "i32"),
)

ARGS: tuple[tuple[str, str], ...] = (
    ("Q", "*{dtype}"), ("K", "*{dtype}"), ("V", "*{dtype}"), ("dO", "*{dtype}"), ("L2", "*fp32"), ("D", "*fp32"),
    ("DQacc", "*fp32"), ("dQ", "*{dtype}"), ("dK", "*{dtype}"), ("dV", "*{dtype}"), ("dBias", "*{dtype}"),
    ("Bias", "*{dtype}"), ("Alibi", "*fp32"), ("cu_seqlens_q", "*i32"), ("cu_seqlens_k", "*i32"),
    ("sm_scale", "fp32"), ("softcap", "fp32"), ("dropout_p", "fp32"), ("seed", "i64"), ("philox_offset", "i64"),
    ("seqlen_q", "i32"), ("seqlen_k", "i32"), ("max_seqlen_q", "i32"), ("max_seqlen_k", "i32"),
    ("nhead_q", "i32"), ("nhead_k", "i32"), ("head_dim_q", "i32"), ("head_dim_v", "i32"),
    ("window_left", "i32"), ("window_right", "i32"), ("mask_bottom_right", "i32"), ("sink", "i32"),
    ("stride_qb", "i32"), ("stride_qh", "i32"), ("stride_qm", "i32"),
    ("stride_kb", "i32"), ("stride_kh", "i32"), ("stride_kn", "i32"),
    ("stride_vb", "i32"), ("stride_vh", "i32"), ("stride_vn", "i32"),
    ("stride_dob", "i32"), ("stride_doh", "i32"), ("stride_dom", "i32"),
    ("stride_db", "i32"), ("stride_dh", "i32"),
    ("stride_as", "i64"), ("stride_ab", "i32"), ("stride_ah", "i32"), ("stride_am", "i32"),
    ("stride_dqb", "i32"), ("stride_dqh", "i32"), ("stride_dqm", "i32"),
    ("stride_dkb", "i32"), ("stride_dkh", "i32"), ("stride_dkn", "i32"),
    ("stride_dvb", "i32"), ("stride_dvh", "i32"), ("stride_dvn", "i32"),
    ("stride_bb", "i32"), ("stride_bh", "i32"), ("stride_bm", "i32"), ("stride_bn", "i32"),
    ("stride_gb", "i32"), ("stride_gh", "i32"), ("stride_gm", "i32"), ("stride_gn", "i32"),
    ("stride_alb", "i32"), ("stride_alh", "i32"),
)

CONVERT_ARGS: tuple[tuple[str, str], ...] = (
    ("DQacc", "*fp32"), ("dQ", "*{dtype}"), ("cu_seqlens_q", "*i32"), ("sm_scale", "fp32"),
    ("seqlen_q", "i32"), ("head_dim_q", "i32"), ("num_splits", "i32"),
    ("stride_as", "i64"), ("stride_ab", "i32"), ("stride_ah", "i32"), ("stride_am", "i32"),
    ("stride_qb", "i32"), ("stride_qh", "i32"), ("stride_qm", "i32"),
)

# pointers and strides that are multiples of 16 in the usual case (16-byte aligned tensors, head dims % 16 == 0):
# promised to the compiler by an aligned build, checked before every launch of one
ALIGNED: tuple[str, ...] = (
    "Q", "K", "V", "dO", "dQ", "dK", "dV", "DQacc",
    "stride_qb", "stride_qh", "stride_qm", "stride_kb", "stride_kh", "stride_kn", "stride_vb", "stride_vh",
    "stride_vn", "stride_dob", "stride_doh", "stride_dom", "stride_dkb", "stride_dkh", "stride_dkn",
    "stride_dvb", "stride_dvh", "stride_dvn", "stride_am", "stride_dqb", "stride_dqh", "stride_dqm",
)

# the 1-d stages' promises: the main stage's tensors and strides, the forward's output and the dQ accumulator's
# strides (multiples of its row stride, which the main stage promises).  An aligned key gets aligned companions,
# whose whole-row accesses are 16-byte vectors (2 bytes at a time without the promise)
DOT_ALIGNED: tuple[str, ...] = ("O", "dO", "stride_ob", "stride_oh", "stride_om", "stride_dob", "stride_doh",
                                "stride_dom")
CONVERT_ALIGNED: tuple[str, ...] = ("DQacc", "dQ", "stride_ab", "stride_ah", "stride_am", "stride_qb", "stride_qh",
                                    "stride_qm")

DOT_BLOCK_M = 64       # rows per program of the 1-d stages (CK's M0_1D)
CONVERT_BLOCK_M = 64
ONE_D_WARPS = 4

_AT = {name: i for i, (name, _) in enumerate(ARGS)}


def block_d(hdim: int) -> int:
    """Head dims are processed as one power-of-two block of at least 16 (the dot's k minimum)."""
    return max(16, 1 << max(0, (int(hdim) - 1).bit_length()))


def converts(deterministic: bool) -> bool:
    """Whether dQ goes through the fp32 accumulator and the convert stage: atomic dQ does; the deterministic dQ
    programs own their rows and store dQ in the input dtype (two stages, no accumulator)."""
    return not deterministic


def splits(deterministic: bool, max_seqlen_k: int, block_n: int) -> int:
    """How many dQ partial sums ``dq_acc`` holds: 1 with atomics, 0 (no accumulator) for the deterministic dQ
    programs.  The convert stage's ``num_splits`` argument keeps CK's split-reduction contract for a template that
    needs more."""
    return 1 if converts(deterministic) else 0


def workspace(batch: int, nhead_q: int, max_seqlen_q: int, max_seqlen_k: int, head_dim_q: int, block_n: int,
              deterministic: bool) -> dict:
    """The backward's fp32 workspace from upper bounds only: ``{"numel", "d_offset", "l_offset", "acc_offset",
    "splits", "d_strides", "acc_strides"}`` (element offsets and strides; ``D`` from ``d_offset``, ``L2`` from
    ``l_offset``, both with ``d_strides``; ``dq_acc``, from ``acc_offset`` to ``numel`` and empty without atomic dQ,
    is zeroed before stage 2)."""
    b, h, sq, dq = int(batch), int(nhead_q), max(1, int(max_seqlen_q)), int(head_dim_q)
    s = splits(deterministic, max_seqlen_k, block_n)
    n_d = -(-b * h * sq // 16) * 16  # each part starts 64-byte aligned
    acc_strides = (b * h * sq * dq, h * sq * dq, sq * dq, dq)
    return {"numel": 2 * n_d + s * acc_strides[0], "d_offset": 0, "l_offset": n_d, "acc_offset": 2 * n_d,
            "splits": s, "d_strides": (h * sq, sq), "acc_strides": acc_strides}


def workspace_parts(buf, ws: dict) -> dict:
    """``{"d", "l2", "acc"}``: the parts of a workspace buffer ``buf`` (a 1-d fp32 array or tensor of at least
    ``ws["numel"]`` elements; ``ws``: :func:`workspace`), as slices of it -- ``acc`` empty without atomic dQ."""
    return {"d": buf[ws["d_offset"]:ws["l_offset"]], "l2": buf[ws["l_offset"]:ws["acc_offset"]],
            "acc": buf[ws["acc_offset"]:ws["numel"]]}


def grids(batch: int, nhead_q: int, nhead_k: int, max_seqlen_q: int, max_seqlen_k: int, block_n: int,
          deterministic: bool = False):
    """The three stages' launch grids (any zero: nothing to launch; the third is launched when :func:`converts`)."""
    sq, sk, bn = int(max_seqlen_q), int(max_seqlen_k), int(block_n)
    main = -(-sk // bn) + (-(-sq // bn) if deterministic and sk > 0 else 0)
    return ((-(-sq // DOT_BLOCK_M), int(nhead_q), int(batch)), (main, int(nhead_k), int(batch)),
            (-(-sq // CONVERT_BLOCK_M), int(nhead_q), int(batch)))


_I64 = 1 << 63
_U64 = (1 << 64) - 1


def _seed_i64(seed) -> int:
    seed = int(seed) & _U64
    return seed - (1 << 64) if seed >= _I64 else seed


def pack(ptrs, group: bool, qs, ks, vs, os_, dos, dqs, dks, dvs, ls, bs, gs, as_, ws: dict, *, nhq, nhk, dq, dv, sq, sk, msq,
         msk, scale, softcap, dropout_p, seed, offset, wl, wr, br, sink) -> tuple[list, list, list]:
    """The three stages' run-time arguments ``(dot, main, convert)``, in :data:`DOT_ARGS`, :data:`ARGS` and
    :data:`CONVERT_ARGS` order -- the one packer of this ABI (the Python path, the interpreter harness and tests).

    ``ptrs``: ``{"q", "k", "v", "out", "dout", "lse", "dq", "dk", "dv", "dbias", "bias", "alibi", "cu_q", "cu_k",
    "d", "l2", "acc"}`` pointer values (0/None for absent ones; ``d``/``l2``/``acc``: the workspace parts, ``acc``
    absent without atomic dQ).  Strides are the
    tensors' own (``q``, ``k``, ``v``, ``out``, ``dout``, ``dq``, ``dk``, ``dv``; batch ``[B, H, S, D]``, group
    ``[T, H, D]``, turned into batch form here); ``ls``: the LSE's
    (``[B, Hq, Sq]`` or ``[Hq, Tq]``); ``bs``/``gs``: bias / dbias strides over ``[B, Hq, Sq, Sk]`` (0 for
    broadcast dims) or None; ``as_``: ALiBi slopes' over ``[B, Hq]`` or None; ``ws``: :func:`workspace`.
    ``sq``/``sk``: batch-mode lengths (0 in group mode)."""
    def bhm(st):  # (batch, head, row) strides
        return (0, st[1], st[0]) if group else (st[0], st[1], st[2])

    lb, lh = (0, ls[0]) if group else (ls[0], ls[1])
    d_st, a_st = ws["d_strides"], ws["acc_strides"]
    p = ptrs.get
    scale = 1.0 / math.sqrt(dq) if scale is None else float(scale)
    dot = [p("out"), p("dout"), p("lse"), p("d"), p("l2"), p("cu_q"), sq, dv, *bhm(os_), *bhm(dos), lb, lh, *d_st]
    main = [p("q"), p("k"), p("v"), p("dout"), p("l2"), p("d"), p("acc"), p("dq"), p("dk"), p("dv"), p("dbias"),
            p("bias"), p("alibi"), p("cu_q"), p("cu_k"), scale, 0.0 if softcap is None else float(softcap),
            float(dropout_p or 0.0), _seed_i64(seed) if dropout_p else 0, int(offset) if dropout_p else 0,
            sq, sk, msq, msk, nhq, nhk, dq, dv, wl, wr, int(bool(br)), int(sink),
            *bhm(qs), *bhm(ks), *bhm(vs), *bhm(dos), *d_st, *a_st, *bhm(dqs), *bhm(dks), *bhm(dvs),
            *((0, 0, 0, 1) if bs is None else bs), *((0, 0, 0, 1) if gs is None else gs),
            *((0, 1) if as_ is None else as_)]
    conv = [p("acc"), p("dq"), p("cu_q"), scale, sq, dq, ws["splits"], *a_st, *bhm(dqs)]
    return dot, main, conv


def bias_strides(shape, strides) -> tuple:
    """Strides over ``[B, Hq, Sq, Sk]`` of a ``[B|1, Hq|1, Sq, Sk]`` bias (0 along broadcast dims)."""
    return tuple(0 if shape[i] == 1 else strides[i] for i in range(4))


__all__ = ["ARGS", "DOT_ARGS", "CONVERT_ARGS", "ALIGNED", "DOT_ALIGNED", "CONVERT_ALIGNED", "DOT_BLOCK_M", "CONVERT_BLOCK_M", "ONE_D_WARPS",
           "block_d", "converts", "splits", "workspace", "workspace_parts", "grids", "pack", "bias_strides"]
