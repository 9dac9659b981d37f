"""Every kernel family's run-time ABI, declared once: plain data the build, the runtime and the tests share.

A :class:`KernelABI` says, for the kernels of one registry family, which Triton template function implements them
(module and name under ``fmha_dsl.kernels``), their run-time parameters in order (names, types; ``"*{dtype}"`` is
the input dtype's pointer), which of them an aligned build promises to be multiples of 16, and which companion
kernels a key of the family is built with (the split-KV combine kernel; the backward's dO.O and dQ-conversion
stages).  Kept free of Triton: the runtime reads it to load and launch binaries, the build to compile them, the
interpreter launcher to run the template on the CPU.

Adding a family: its template module (``triton_<name>.py``, the ``@triton.jit`` function and
``constexprs(sig, alg)``), its ABI module (``<name>_abi.py``: the argument list, the one packer, grids and
workspace), one :class:`KernelABI` row below, its rules (``fmha_dsl/rules/triton_<name>.py``) and its reference.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from . import bwd_abi, fwd_abi, paged_abi


# CK's dtype contracts whose inputs and output differ: key dtype -> (Triton element type of Q/K/V, output dtype).
# fp8bf16: FP8 e4m3 (OCP, "fn": no infinities) inputs with per-tensor descales, bf16 output.
CONTRACTS: dict[str, tuple[str, str]] = {"fp8bf16": ("fp8e4nv", "bf16")}


def element_type(dtype: str) -> str:
    """The Triton element type of a key dtype's inputs (``fp8e4nv`` for ``fp8bf16``; else the dtype itself)."""
    return CONTRACTS.get(dtype, (dtype, dtype))[0]


def output_dtype(dtype: str) -> str:
    """The dtype a key dtype's kernels write (``bf16`` for ``fp8bf16``; else the dtype itself)."""
    return CONTRACTS.get(dtype, (dtype, dtype))[1]


@dataclass(frozen=True)
class KernelABI:
    family: str                                  # the registry family whose kernels take these arguments
    template: str                                # the template module under fmha_dsl.kernels
    function: str                                # its @triton.jit function
    args: tuple[tuple[str, str], ...]            # run-time parameters in order: (name, type)
    aligned: tuple[str, ...] = ()                # what an aligned build promises 16-divisible
    v_stride: bool = False                       # add V's non-unit stride (vlayout) to `aligned`
    companions: tuple[tuple[str, str], ...] = () # (role, family) of the kernels built with a key of this family
    project: tuple[str, ...] = ()                # as a companion: the signature fields its binary depends on
    project_alg: tuple[str, ...] = ()            # ... and the algorithm fields (CK's default when absent: 1)
    overrides: tuple[tuple[str, str], ...] = field(default=())  # (name, type) replacing a declared type
    sources: tuple[str, ...] = ()                # modules under fmha_dsl.kernels whose text shapes the binary
    num_warps: int = 4                           # as a companion: the warps it is compiled with
    waits_prior: bool = False                    # as a companion: its template takes WAIT_PRIOR (griddepcontrol.wait
                                                 # before its first read), so on archs with programmatic dependent
                                                 # launch it is launched to overlap the end of the kernel before it
    writes_output: bool = False                  # as a companion: it takes fp32 partials and writes the output, so its
                                                 # dtype is the key's output dtype (one bf16 combine serves fp8bf16)

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.args)

    def index(self, name: str) -> int:
        return self.names.index(name)

    def types(self, dtype: str) -> tuple[str, ...]:
        """Parameter types for key dtype ``dtype`` (``fp16`` / ``bf16`` / ``fp32``, or a dtype contract such as
        CK's ``fp8bf16``: ``"*{dtype}"`` becomes its inputs' element type, ``"*{out}"`` its output's)."""
        over = dict(self.overrides)
        el, out = element_type(dtype), output_dtype(dtype)
        return tuple(over.get(n, t).format(dtype=el, out=out) for n, t in self.args)

    def promised(self, sig: dict) -> tuple[str, ...]:
        """The parameters an aligned build of key ``sig`` promises 16-divisible."""
        if self.v_stride:
            return fwd_abi.aligned_names(sig.get("vlayout", "r"))
        return self.aligned


_FWD = ("triton_fwd", "triton_fwd_loops", "triton_steps", "fwd_host", "triton_combine", "fwd_abi")
_BWD = ("triton_bwd", "triton_bwd_steps", "triton_bwd_stages", "triton_steps", "bwd_abi")
_PAGED = ("triton_paged", "paged_host", "triton_paged_rows", "triton_paged_scales", "triton_steps", "paged_abi",
          "fwd_abi")
_APPEND = ("triton_appendkv", "triton_paged_rows", "paged_abi", "fwd_abi")
_GATHER = ("triton_gather", "triton_paged_rows", "paged_abi", "fwd_abi")

ABIS: dict[str, KernelABI] = {a.family: a for a in (
    KernelABI("fwd", "triton_fwd", "fmha_fwd", fwd_abi.ARGS, fwd_abi.ALIGNED, v_stride=True, sources=_FWD),
    KernelABI("fwd_splitkv", "triton_fwd", "fmha_fwd", fwd_abi.ARGS, fwd_abi.ALIGNED, v_stride=True,
              companions=(("combine", "fwd_splitkv_combine"),), overrides=(("Out", "*fp32"),), sources=_FWD),
    KernelABI("fwd_splitkv_combine", "triton_combine", "fmha_fwd_combine", fwd_abi.COMBINE_ARGS,
              project=("dtype", "hdim_v", "mode", "lse"), sources=_FWD, num_warps=fwd_abi.COMBINE_WARPS,
              waits_prior=True, writes_output=True),
    KernelABI("bwd_dq_dk_dv", "triton_bwd", "fmha_bwd_dq_dk_dv", bwd_abi.ARGS, bwd_abi.ALIGNED,
              companions=(("dot_do_o", "bwd_dot_do_o"), ("convert_dq", "bwd_convert_dq")), sources=_BWD),
    KernelABI("bwd_dot_do_o", "triton_bwd", "fmha_bwd_dot_do_o", bwd_abi.DOT_ARGS, bwd_abi.DOT_ALIGNED,
              project=("dtype", "hdim_v", "mode"), project_alg=("pad_dv",), sources=_BWD),
    KernelABI("bwd_convert_dq", "triton_bwd", "fmha_bwd_convert_dq", bwd_abi.CONVERT_ARGS, bwd_abi.CONVERT_ALIGNED,
              project=("dtype", "hdim_q", "mode", "deterministic"), project_alg=("pad_d",), sources=_BWD),
    KernelABI("batch_prefill", "triton_paged", "fmha_paged", paged_abi.ARGS, paged_abi.ALIGNED, sources=_PAGED),
    KernelABI("fwd_pagedkv", "triton_paged", "fmha_paged", paged_abi.ARGS, paged_abi.ALIGNED,
              companions=(("combine", "fwd_splitkv_combine"),), overrides=(("Out", "*fp32"),), sources=_PAGED),
    KernelABI("fwd_appendkv", "triton_appendkv", "fmha_appendkv", paged_abi.APPEND_ARGS, paged_abi.APPEND_ALIGNED,
              sources=_APPEND),
    # the gathered route's copy (batch_prefill through the forward family: fmha_dsl.runtime.plan_gather)
    KernelABI("kv_gather", "triton_gather", "fmha_kv_gather", paged_abi.GATHER_ARGS, paged_abi.GATHER_ALIGNED,
              project=paged_abi.GATHER_FIELDS,
              sources=_GATHER),
)}


def abi_of(family: str) -> KernelABI | None:
    """The ABI of ``family``'s Triton kernels, or None when the Triton backend has no template for it."""
    return ABIS.get(family)


def companion_sig(sig: dict, family: str, aligned: bool = True, alg: dict | None = None) -> dict:
    """The signature of companion family ``family`` built with a key ``(sig, alg)``: its projected fields (those of
    ``alg`` as ints; without ``alg``, CK's default 1); ``"unaligned": True`` when the key's binary is built without
    the 16-divisibility promise and the companion has promises of its own (``aligned``), which it then drops too."""
    a = ABIS[family]
    csig = {"family": family, **{f: sig[f] for f in a.project if f in sig}}
    if a.writes_output and "dtype" in csig:
        csig["dtype"] = output_dtype(csig["dtype"])
    csig.update({f: int((alg or {}).get(f, 1)) for f in a.project_alg})
    if a.aligned and not aligned:
        csig["unaligned"] = True
    return csig


def companion_name(csig: dict, arch: str) -> str:
    """The file and registry name of a companion kernel of signature ``csig``."""
    f = csig["family"]
    if f == "kv_gather":
        return (f"fmha_kv_gather_d{csig['hdim_q']}_{csig['hdim_v']}_{csig['dtype']}_{csig['kv_layout']}_"
                f"{csig['kv_lookup']}_ps{csig['page_size']}_triton_{arch}")
    if f == "fwd_splitkv_combine":
        return (f"fmha_fwd_splitkv_combine_d{csig['hdim_v']}_{csig['dtype']}_{csig['mode']}_"
                f"{'lse' if csig['lse'] else 'nlse'}_triton_{arch}")
    parts = [f"fmha_{f}", f"d{csig.get('hdim_q', csig.get('hdim_v'))}", csig["dtype"], csig["mode"]]
    if "deterministic" in csig:
        parts.append("deterministic" if csig["deterministic"] else "ndeterministic")
    for fld in ABIS[f].project_alg:  # pad_dv -> pdv / npdv, as CK's names spell padding
        parts.append(("p" if csig.get(fld, 1) else "np") + fld[len("pad_"):])
    if csig.get("unaligned"):
        parts.append("unaligned")
    return "_".join(parts) + f"_triton_{arch}"


__all__ = ["KernelABI", "ABIS", "abi_of", "companion_sig", "companion_name", "CONTRACTS", "element_type",
           "output_dtype"]
