"""Which registry kernels serve a problem, in what static order, and the no-kernel error.

The matching rules are documented in :mod:`fmha_dsl.runtime.dispatch` (CK's ``supports()``); this module is
pure Python over registry entries and problems.
"""

from __future__ import annotations

import math
from functools import reduce

from fmha_dsl.errors import Diagnostic, DispatchError, FmhaError
from fmha_dsl.registry import Entry

from .device import over_limits

# Signature fields compared exactly (CK's fmha_signature_matches), besides mask, head dims and the conditionals
EXACT = ("family", "dtype", "mode", "vlayout", "bias", "lse", "dropout", "logits", "sink", "qscale", "rope",
         "paged_kv", "fp8_static_quant", "skip", "dbias", "store_randval", "deterministic")
PAGED_FAMILIES = ("fwd_pagedkv", "fwd_appendkv", "fwd_splitkv", "fwd_splitkv_combine", "batch_prefill")
PIPELINE_RANK = {"qr_async": 0, "qr_async_trload": 1, "qr_async_trload_v3": 2, "qr": 3}  # ties: pipelined loads first

# ---------------------------------------------------------------------------------------------------------
# matching
# ---------------------------------------------------------------------------------------------------------
def _pfield(problem, name):
    return getattr(problem, name)


def _max_sq(p) -> int:
    return p.max_seqlen_q or p.seqlen_q


def _max_sk(p) -> int:
    return p.max_seqlen_k or p.seqlen_k


def promised_aligned(build) -> tuple[str, ...]:
    """Argument names a binary was compiled to assume 16-divisible (``tt.divisibility``), from its build."""
    if not build:
        return ()
    return tuple(build.get("aligned") or ())


def promised_indices(build, names) -> tuple[int, ...]:
    """Positions in the argument list ``names`` of the arguments a binary was compiled to assume 16-divisible (what
    :func:`fmha_dsl.runtime.plan.check_promise` checks before a launch)."""
    return tuple(names.index(n) for n in promised_aligned(build) if n in names)


def mismatches(e: Entry, p, aligned: bool = True) -> list[tuple[str, str]]:
    """Why entry ``e`` cannot serve problem ``p``: ``[(field, explanation), ...]``; empty = it can."""
    s, a = e.sig, e.alg
    out = []
    for f in EXACT:
        kv, pv = s[f], _pfield(p, f)
        if kv != pv and not (f == "family" and serves_fwd(e) and pv == SERVES[kv]) and not (f == "deterministic"
                                                                                             and kv):
            out.append((f, f"kernel {_show(kv)}, problem {_show(pv)}"))
    if s["family"] != "fwd_splitkv_combine" and (s["mask"] != "no") != (p.mask != "no"):
        out.append(("mask", f"kernel {_mask_word(s['mask'])}, problem {_mask_word(p.mask)}"))
    for f, pf, pad in (("hdim_q", "hdim_q", "pad_d"), ("hdim_v", "hdim_v", "pad_dv")):
        kv, pv = s[f], _pfield(p, pf)
        if pv > kv:
            out.append((f, f"kernel {kv} < problem {pv}"))
        elif not a[pad] and pv != kv:
            out.append((f, f"kernel {kv} without padding ({pad}=0) needs exactly {kv}, problem {pv}"))
    m0, n0 = a["tile"][0], a["tile"][1]   # (0 for the 1-d kernels -- combine, dot_do_o, convert_dq: no tile)
    if m0 and not a["pad_s"] and _max_sq(p) % m0:
        out.append(("pad_s", f"kernel pads no query rows: needs max_seqlen_q % {m0} == 0, problem {_max_sq(p)}"))
    if not a["pad_sk"]:
        if p.mode != "batch":
            out.append(("pad_sk", "kernel pads no key columns: group mode (variable seqlen_k) needs pad_sk"))
        elif n0 and _max_sk(p) % n0:
            out.append(("pad_sk", f"kernel pads no key columns: needs seqlen_k % {n0} == 0, problem {_max_sk(p)}"))
    if a["max_seq_len_q"] > 0 and _max_sq(p) > a["max_seq_len_q"]:
        out.append(("max_seq_len_q", f"kernel serves max_seqlen_q <= {a['max_seq_len_q']}, problem {_max_sq(p)}"))
    if a["max_splits_log2"] > 0 and p.num_splits > (1 << a["max_splits_log2"]):
        limit = 1 << a["max_splits_log2"]
        out.append(("max_splits_log2", f"kernel serves <= {limit} splits, problem {p.num_splits}"))
    fam = s["family"]
    if fam == "batch_prefill" or p.family == "batch_prefill" or (
            fam in ("fwd_pagedkv", "fwd_appendkv") and s["paged_kv"] and _compiled_in(e)):
        for f in ("kv_layout", "kv_lookup"):
            if s[f] != _pfield(p, f):
                out.append((f, f"kernel {s[f]}, problem {_pfield(p, f)}"))
    if fam in PAGED_FAMILIES and s["page_size"] != p.page_size and (s["page_size"] > 1 or _compiled_in(e)) and (
            s["paged_kv"] or fam != "fwd_appendkv"):  # (a contiguous cache has no pages)
        out.append(("page_size", f"kernel {s['page_size']}, problem {p.page_size}"))
    if not aligned and promised_aligned(e.build):
        out.append(("aligned", "kernel assumes 16-divisible pointers and strides; these arguments are not"))
    return out


# split-KV families and the family whose problems they also serve (with their combine kernel)
SERVES = {"fwd_splitkv": "fwd", "fwd_pagedkv": "batch_prefill"}


def serves_fwd(e: Entry) -> bool:
    """A compiled split-KV kernel (with its combine kernel) computes the unsplit family's problem too (``fwd`` for
    ``fwd_splitkv``, ``batch_prefill`` for the paged ``fwd_pagedkv``): selection weighs it against that family's
    kernels (a ``fwd_splitkv`` problem, which asks for ``num_splits``, gets only split kernels)."""
    return e.sig["family"] in SERVES and bool((e.build or {}).get("combine"))


def _compiled_in(e: Entry) -> bool:
    """Whether ``e``'s page size is compiled into its binary (the Triton serving kernels; CK's page size 1 kernels
    serve any page size)."""
    return (e.build or {}).get("backend") == "triton" or e.name.endswith(f"_triton_{e.arch}")


_DET = EXACT.index("deterministic")


def group_key(sig_or_problem, getter) -> tuple:
    """:func:`_exact_key` with ``fwd_splitkv`` counted as ``fwd`` and without ``deterministic``: the index under which
    the kernels that may serve a problem meet (a split-KV kernel serves a plain forward problem; a deterministic
    backward kernel -- a fixed-order dQ reduction -- serves a problem that does not ask for one, and first-use
    selection weighs it against the atomic kernels)."""
    k = _exact_key(sig_or_problem, getter)
    k = k[:_DET] + k[_DET + 1:]
    return (SERVES[k[0]],) + k[1:] if k[0] in SERVES else k


def _show(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _mask_word(m: str) -> str:
    return "no mask" if m == "no" else f"masked ({m})"


def preference(e: Entry) -> tuple:
    """Sort key among matching entries: smaller is preferred (see the module docstring)."""
    a, s = e.alg, e.sig
    padded = sum(1 for f in ("pad_s", "pad_sk", "pad_d", "pad_dv") if a[f])
    return (s["hdim_q"], s["hdim_v"], padded, a["selection_rank"], -a["tile"][0], -a["tile"][1],
            PIPELINE_RANK.get(a["pipeline"], len(PIPELINE_RANK)), e.identifier)


def _exact_key(sig_or_problem, getter) -> tuple:
    return tuple(getter(sig_or_problem, f) for f in EXACT) + ((getter(sig_or_problem, "mask") != "no"),)


def _lcm(values) -> int:
    return reduce(lambda x, y: x * y // math.gcd(x, y), values, 1)


# ---------------------------------------------------------------------------------------------------------
# the no-match error
# ---------------------------------------------------------------------------------------------------------
def declaration_for(p, arch: str, name: str = "extra") -> str:
    """``.fmha`` text declaring a Triton kernel that serves problem ``p`` on ``arch`` (padded, any seqlen)."""
    mask = "top_left" if p.mask != "no" else "no"
    bwd = p.family.startswith("bwd")
    label = f"{'bwd' if bwd else 'fwd'}_{p.dtype}_d{p.hdim_q}x{p.hdim_v}_{p.mode}" + ("_causal" if mask != "no" else "")
    sig = (f"family({p.family}) dtype({p.dtype}) mode({p.mode}) vlayout({p.vlayout}) hdim({p.hdim_q}, {p.hdim_v}) "
           f"mask({mask}) bias({p.bias}) lse({_show(p.lse)}) dropout({_show(p.dropout)}) "
           f"logits({_show(p.logits)}) sink({_show(p.sink)})")
    if bwd:
        sig += f" dbias({_show(p.dbias)}) deterministic({_show(p.deterministic)})"
    return (f"kernel_set {name} {{\n"
            f"    backend(triton)\n"
            f"    arch({arch})\n"
            f"    kernel {label} {{\n"
            f"        signature {{ {sig} }}\n"
            f"        algorithm {{ pipeline(*) tile(*) padding(true, true, true, true) }}\n"
            f"    }}\n"
            f"}}\n")


def describe(p) -> str:
    """One line naming a problem's class."""
    extras = [f for f in ("lse", "dropout", "logits", "sink", "dbias", "deterministic") if _pfield(p, f)]
    bias = "" if p.bias == "no" else f" bias={p.bias}"
    return (f"{p.family} {p.dtype} {p.mode} Dq={p.hdim_q} Dv={p.hdim_v} vlayout={p.vlayout} mask={p.mask}{bias}"
            f" max_seqlen_q={_max_sq(p)} seqlen_k={_max_sk(p)}" + (" " + " ".join(extras) if extras else ""))


def no_kernel_error(p, arch: str, entries, reg_name: str, all_archs=(), aligned: bool = True, too_big=(),
                    limits=None) -> FmhaError:
    """The ``dispatch.no-kernel`` error (the closest entries and how they differ), or -- when among ``too_big``, the
    arch's entries left out because they need more shared memory per block than the GPU's ``limits`` allow, some
    would serve ``p`` -- the ``dispatch.shared-memory`` error."""
    entries = list(entries)
    big = [e for e in too_big if not mismatches(e, p, aligned)]
    if big:  # the registry has the kernel, this device cannot launch it
        need, have = min(over_limits(e, limits or {}) for e in big), (limits or {}).get("shared_bytes")
        return DispatchError(Diagnostic(
            "dispatch.shared-memory", f"registry `{reg_name}` serves {describe(p)} on {arch} only with kernels that "
            f"need more shared memory per block than this GPU has ({need} bytes at least; it has {have})", None,
            "rebuild the set for this device with smaller tiles or fewer stages (`tile(...)`, `pipeline(...)` in the "
            ".fmha file), or call with registry=None: first use compiles what fits",
            tuple(f"too big: {e.name} ({over_limits(e, limits or {})} bytes)" for e in big[:3])))
    notes = []
    if not entries:
        have = ", ".join(all_archs) or "none"
        notes.append(f"registry `{reg_name}` has no kernels for {arch} (it has: {have})")
    scored = []
    for e in entries:
        mm = mismatches(e, p, aligned)
        hd = abs(e.sig["hdim_q"] - p.hdim_q) + abs(e.sig["hdim_v"] - p.hdim_v)
        scored.append((len(mm), hd, e.name, e, mm))
    scored.sort(key=lambda t: t[:3])
    for _, _, _, e, mm in scored[:3]:
        diffs = "; ".join(f"{f} ({why})" for f, why in mm)
        where = f" [{e.source}]" if e.source else ""
        notes.append(f"closest: {e.name}{where}: differs in {diffs}")
    decl = declaration_for(p, arch)
    hint = ("add this declaration to a .fmha file and rebuild (`fmha-dsl build FILE --backend triton "
            f"--arch {arch} -o DIR`), or call with registry=None to compile it on first use:\n{decl}")
    return DispatchError(Diagnostic("dispatch.no-kernel", f"no kernel in registry `{reg_name}` for {arch} serves "
                                f"{describe(p)}", None, hint, tuple(notes)))
