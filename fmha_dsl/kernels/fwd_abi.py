"""The forward template's run-time parameter list: plain data shared by the template and the runtime.

Kept free of Triton so the runtime (which must not import the compiler) and the template read the same
tuple: ``fmha_fwd``'s non-constexpr parameters in order; ``"*{dtype}"`` is the input dtype's pointer.
"""

from __future__ import annotations

ARGS: tuple[tuple[str, str], ...] = (
    ("Q", "*{dtype}"), ("K", "*{dtype}"), ("V", "*{dtype}"), ("Out", "*{dtype}"), ("Lse", "*fp32"),
    ("Bias", "*{dtype}"), ("Alibi", "*fp32"), ("cu_seqlens_q", "*i32"), ("cu_seqlens_k", "*i32"),
    ("sm_scale", "fp32"), ("softcap", "fp32"), ("dropout_p", "fp32"), ("seed", "i64"), ("philox_offset", "i64"),
    ("seqlen_q", "i32"), ("seqlen_k", "i32"), ("max_seqlen_q", "i32"), ("max_seqlen_k", "i32"),
    ("nhead_q", "i32"), ("nhead_k", "i32"), ("head_dim_q", "i32"), ("head_dim_v", "i32"),
    ("window_left", "i32"), ("window_right", "i32"), ("mask_bottom_right", "i32"), ("sink", "i32"),
    ("stride_qb", "i32"), ("stride_qh", "i32"), ("stride_qm", "i32"), ("stride_qd", "i32"),
    ("stride_kb", "i32"), ("stride_kh", "i32"), ("stride_kn", "i32"), ("stride_kd", "i32"),
    ("stride_vb", "i32"), ("stride_vh", "i32"), ("stride_vn", "i32"), ("stride_vd", "i32"),
    ("stride_ob", "i32"), ("stride_oh", "i32"), ("stride_om", "i32"), ("stride_od", "i32"),
    ("stride_lb", "i32"), ("stride_lh", "i32"), ("stride_lm", "i32"),
    ("stride_bb", "i32"), ("stride_bh", "i32"), ("stride_bm", "i32"), ("stride_bn", "i32"),
    ("stride_ab", "i32"), ("stride_ah", "i32"),
)

# Arguments that are multiples of 16 (bytes for pointers, elements for strides) in the usual case:
# 16-byte aligned base pointers and head dims that are multiples of 16.  V's non-unit stride is added
# per layout (aligned_names).  See triton_fwd.attrs() / aligned().
ALIGNED: tuple[str, ...] = (
    "Q", "K", "V", "Out",
    "stride_qb", "stride_qh", "stride_qm", "stride_kb", "stride_kh", "stride_kn",
    "stride_vb", "stride_vh", "stride_ob", "stride_oh", "stride_om",
)


def aligned_names(vlayout: str = "r") -> tuple[str, ...]:
    """:data:`ALIGNED` plus V's non-unit stride (``stride_vn`` for "r", ``stride_vd`` for "c")."""
    return ALIGNED + (("stride_vd",) if vlayout == "c" else ("stride_vn",))


def block_d(hdim: int) -> int:
    """Head dims are processed as one power-of-two block of at least 16 (the dot's k minimum)."""
    return max(16, 1 << max(0, (int(hdim) - 1).bit_length()))
