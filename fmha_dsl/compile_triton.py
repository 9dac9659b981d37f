"""[build] Compile one kernel key ahead of time with Triton, for an AMD (hsaco) or NVIDIA (cubin) target.

No GPU is needed: Triton generates code for a ``GPUTarget`` in-process.  The result is the binary, the
launch metadata (entry name, warps, stages, shared memory, grid rule, parameter order) and the resource
usage read offline: the ``.amdgcn`` notes for AMD (VGPRs, SGPRs, spills, scratch, occupancy) and the
bundled ``cuobjdump --dump-resource-usage`` for cubins (registers, stack, local memory).

Failures are data: :func:`compile_key` returns ``(None, reason)`` instead of raising, so one bad kernel
does not stop a build.  Runs in worker processes; triton is imported here only.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import tempfile

@functools.lru_cache(maxsize=None)
def template_sha256(family: str = "fwd") -> str:
    """Hash of everything that shapes the generated code of ``family``'s kernels: the modules its ABI names as
    sources (template, argument list, head-dim blocking) and this mapping module."""
    from importlib import import_module

    from .kernels.abis import abi_of

    h = hashlib.sha256()
    for mod in tuple(f"fmha_dsl.kernels.{m}" for m in abi_of(family).sources) + (__name__,):
        with open(import_module(mod).__file__, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def triton_version() -> str:
    import triton

    return triton.__version__


def arch_info(arch: str) -> dict:
    from .arch import info

    return info(arch)


def compile_options(sig: dict, alg: dict, arch: str) -> dict:
    """CK algorithm fields -> Triton compile options (docs/triton.md)."""
    info = arch_info(arch)
    if sig.get("family", "fwd").startswith("bwd"):
        from .rules.triton_bwd import stages as bwd_stages

        opts = {"num_warps": int(alg["wave"][0]), "num_stages": bwd_stages(arch, alg)}
    elif sig.get("family") in ("batch_prefill", "fwd_pagedkv"):  # K/V addressed through the page table
        from .rules.triton_paged import compile_stages

        opts = {"num_warps": int(alg["wave"][0]),
                "num_stages": compile_stages({"arch": arch, "pipeline": alg["pipeline"]})}
    else:
        from .rules.triton_fwd import stages

        opts = {"num_warps": int(alg["wave"][0]), "num_stages": stages({"arch": arch, "pipeline": alg["pipeline"]})}
    if info["vendor"] == "amd":
        if info["matrix"] == "mfma":
            opts["matrix_instr_nonkdim"] = int(alg["warp"][0]) if alg["warp"][0] in (16, 32) else 16
        if alg["block_per_cu"] > 0:
            opts["waves_per_eu"] = int(alg["block_per_cu"])
    return opts


def cache_parts(sig: dict, alg: dict, arch: str, aligned: bool = True) -> dict:
    """Everything that decides the binary's bytes (the cache key is its sha256)."""
    return {"sig": sig, "alg": {k: list(v) if isinstance(v, tuple) else v for k, v in alg.items()}, "arch": arch,
            "template": template_sha256(sig.get("family", "fwd")), "triton": triton_version(),
            "options": compile_options(sig, alg, arch), "aligned": aligned}


def _target(arch: str):
    from triton.backends.compiler import GPUTarget

    info = arch_info(arch)
    return GPUTarget(info["backend"], info["target"], info["warp_size"])


def _source(family: str, dtype: str, const: dict, promised=()):
    """The ``ASTSource`` of ``family``'s template function with constexprs ``const`` (and the 16-divisibility
    promise for the parameters ``promised``)."""
    from importlib import import_module

    from triton.compiler import ASTSource

    from .kernels.abis import abi_of

    abi = abi_of(family)
    fn = getattr(import_module(f"fmha_dsl.kernels.{abi.template}"), abi.function)
    signature = dict(zip(abi.names, abi.types(dtype)))
    signature.update({name: "constexpr" for name in const})
    attrs = {(abi.index(n),): [["tt.divisibility", 16]] for n in promised}
    return ASTSource(fn=fn, signature=signature, constexprs=const, attrs=attrs)


def _grid(family: str) -> str:
    return {"fwd": "[cdiv(max_seqlen_q, BLOCK_M), nhead_q, batch]",
            "fwd_splitkv": "[cdiv(max_seqlen_q, BLOCK_M), nhead_q * splits, batch]",
            "bwd_dq_dk_dv": "[cdiv(max_seqlen_k, BLOCK_N), nhead_k, batch]"}.get(
        family, "[cdiv(max_seqlen_q, BLOCK_M), nhead_q, batch]")


def compile_key(sig: dict, alg: dict, arch: str, aligned: bool = True) -> tuple[dict | None, object]:
    """Compile one kernel of any family the Triton backend implements (:mod:`fmha_dsl.kernels.abis`).  Returns
    ``(meta, binary_bytes)`` or ``(None, reason)``.

    ``aligned`` promises the compiler 16-divisible pointers and strides (the ABI's ``promised``): 16-byte vector
    loads, async copies and no spills where it would otherwise load element by element.  Such a binary records the
    promise in ``meta["aligned"]`` and may only be launched with arguments that keep it; the dispatcher checks.
    """
    try:
        import triton.compiler  # noqa: F401
    except ImportError as exc:
        return None, f"triton is not installed ({exc}); install fmha-dsl[triton]"
    from importlib import import_module

    from .kernels.abis import abi_of

    family = sig.get("family", "fwd")
    abi = abi_of(family)
    if abi is None:
        return None, f"the triton backend has no template for family {family}"
    tmpl = import_module(f"fmha_dsl.kernels.{abi.template}")
    opts = compile_options(sig, alg, arch)
    try:
        const = tmpl.constexprs(sig, alg)
        if const.get("TMA") and not aligned:
            return None, (f"pipeline {alg['pipeline']} (TMA descriptors) needs 16-byte aligned K/V bases and strides; "
                          "it has no unaligned build")
        promised = abi.promised(sig) if aligned else ()
        src = _source(family, sig["dtype"], const, promised)
    except Exception as exc:  # noqa: BLE001  (a bad key is a result, not a crash)
        return None, _reason(exc)
    extra = {"block_m": int(alg["tile"][0]), "aligned": list(promised)}
    if family == "fwd_splitkv":
        extra["splits"] = 1 << int(alg["max_splits_log2"])
        extra["block_dv"] = int(const["BLOCK_DV"])
    if family == "bwd_dq_dk_dv":
        extra["block_n"] = int(alg["tile"][1])
    return _compile(src, arch, opts, family, _grid(family), extra)


def companion_parts(csig: dict, arch: str) -> dict:
    """What decides the bytes of a companion kernel (signature ``csig``: :func:`fmha_dsl.kernels.abis.companion_sig`)
    -- its cache key."""
    return {"companion": csig, "arch": arch, "template": template_sha256(csig["family"]),
            "triton": triton_version(), "options": _companion_options(csig["family"])}


def _companion_options(family: str) -> dict:
    from .kernels.abis import abi_of

    return {"num_warps": abi_of(family).num_warps, "num_stages": 1}


def compile_companion(csig: dict, arch: str) -> tuple[dict | None, object]:
    """Compile a companion kernel (the split-KV combine, the backward's dot_do_o / convert_dq).  ``(meta, binary)``
    or ``(None, reason)``."""
    try:
        import triton.compiler  # noqa: F401
    except ImportError as exc:
        return None, f"triton is not installed ({exc}); install fmha-dsl[triton]"
    from importlib import import_module

    from .kernels.abis import abi_of

    abi = abi_of(csig["family"])
    tmpl = import_module(f"fmha_dsl.kernels.{abi.template}")
    promised = () if csig.get("unaligned") else abi.promised(csig)
    # a companion that waits for the kernel before it (in the kernel) is launched to overlap that kernel's end
    after_prior = abi.waits_prior and bool(arch_info(arch).get("pdl"))
    try:
        const = tmpl.constexprs(csig, {f: csig[f] for f in abi.project_alg if f in csig})
        if abi.waits_prior:
            const["WAIT_PRIOR"] = after_prior
        src = _source(csig["family"], csig["dtype"], const, promised)
    except Exception as exc:  # noqa: BLE001
        return None, _reason(exc)
    extra = {"block_m": int(const["BLOCK_M"]), "aligned": list(promised)}
    if after_prior:
        extra["after_prior"] = True
    return _compile(src, arch, _companion_options(csig["family"]), csig["family"],
                    "[cdiv(max_seqlen_q, BLOCK_M), nhead_q, batch]", extra)


def _reason(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"[:500]


def _compile(src, arch: str, opts: dict, family: str, grid: str, extra: dict) -> tuple[dict | None, object]:
    from .kernels.abis import abi_of

    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    import triton

    info = arch_info(arch)
    try:
        ck = triton.compile(src, target=_target(arch), options=opts)
    except Exception as exc:  # noqa: BLE001  (a compiler failure is a result, not a crash)
        return None, _reason(exc)
    kind = info["binary"]
    data = ck.asm[kind]
    md = ck.metadata
    meta = {
        "backend": "triton", "triton": triton_version(), "template_sha256": template_sha256(family),
        "target": f"{info['backend']}:{info['target']}", "entry": md.name, "binary_kind": kind,
        "num_warps": md.num_warps, "num_stages": md.num_stages, "shared": md.shared, "warp_size": info["warp_size"],
        "block": [md.num_warps * info["warp_size"], 1, 1], "options": opts, "grid": grid,
        "params": list(abi_of(family).names),
        "global_scratch": getattr(md, "global_scratch_size", 0) or 0,
        "profile_scratch": getattr(md, "profile_scratch_size", 0) or 0,
        **extra,
    }
    meta["resources"] = amd_resources(ck.asm.get("amdgcn", "")) if kind == "hsaco" else cuda_resources(data)
    return meta, data


_AMD_NOTES = {
    "vgpr": r"\.vgpr_count:\s+(\d+)", "sgpr": r"\.sgpr_count:\s+(\d+)",
    "vgpr_spill": r"\.vgpr_spill_count:\s+(\d+)", "sgpr_spill": r"\.sgpr_spill_count:\s+(\d+)",
    "scratch_bytes": r"\.private_segment_fixed_size:\s+(\d+)", "occupancy": r";\s*Occupancy:\s+(\d+)",
    "agpr": r"\.agpr_count:\s+(\d+)",
}


def amd_resources(amdgcn: str) -> dict:
    """VGPR/SGPR counts, spills, scratch and occupancy from the ``.amdgcn`` text's notes."""
    out = {}
    for key, pat in _AMD_NOTES.items():
        m = re.search(pat, amdgcn)
        if m:
            out[key] = int(m.group(1))
    # SGPR spills go to VGPR lanes (v_writelane), not memory; VGPR spills and scratch go to memory
    out["spills"] = out.get("vgpr_spill", 0) + out.get("scratch_bytes", 0)
    return out


def _cuobjdump() -> str | None:
    try:
        import triton

        path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    except ImportError:
        return None
    return path if os.path.exists(path) else None


def cuda_resources(cubin: bytes) -> dict:
    """REG/STACK/SHARED/LOCAL from the bundled cuobjdump (spills = local memory bytes)."""
    tool = _cuobjdump()
    if tool is None:
        return {"note": "cuobjdump not found"}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                                 timeout=60).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            return {"note": f"cuobjdump failed: {exc}"}
    res = {}
    for key, name in (("regs", "REG"), ("stack", "STACK"), ("shared_static", "SHARED"), ("local", "LOCAL")):
        m = re.search(rf"\b{name}:(\d+)", out)
        if m:
            res[key] = int(m.group(1))
    res["spills"] = res.get("stack", 0) + res.get("local", 0)  # a stack frame in a Triton kernel means spills
    return res


__all__ = ["compile_key", "compile_companion", "companion_parts", "compile_options", "cache_parts",
           "template_sha256", "triton_version",
           "amd_resources", "cuda_resources"]
