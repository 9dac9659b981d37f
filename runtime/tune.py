"""Tune a build directory on the GPU: time every compiled kernel over a shape matrix into the seqtune table.

    from fmha_dsl.runtime.tune import tune
    res = tune("build/bench", shapes=None, budget=600, progress=print)   # -> TuneResult; DIR/registry.json updated

* Shape matrix: ``fmha_dsl/data/seqtune_shapes.json`` by default; ``shapes=`` a JSON file, or YAML
  (``.yaml``/``.yml``, needs PyYAML: ``pip install fmha-dsl[tune]``).  Each entry of ``classes`` expands over its
  lists (``dtype``, ``hdim`` (or ``hdim_q``/``hdim_v`` pairs), ``mask``: ``no``/``causal``, optional ``lse``),
  with points at every ``seqlens`` value: ``seqlen_k`` = seqlen (or ``seqlen_k_ratio`` x seqlen, or every value of
  a ``seqlens_k`` list: decode and chunked prefill); ``batch`` = ``tokens // max(seqlen_q, seqlen_k)`` (at least 1)
  or the ``batch`` list, plus ``extra_batches``; ``nhead_q``/``nhead_k``.  ``family``: ``fwd`` (default), ``bwd``,
  or a serving class, ``batch_prefill`` / ``fwd_pagedkv`` (the same problem: ``fmha_dsl.paged_attention``'s, whose
  candidates are the batch_prefill kernels and the split-KV fwd_pagedkv ones with their combine) with lists
  ``page_size`` (powers of two, default 16), ``lookup`` (``vllm``/``sglang``, default vllm) and ``kv_layout``
  (:data:`KV_LAYOUTS`) in its class; its points need seqlen_k >= seqlen_q.  A serving class may take dtype
  ``fp8bf16`` (e4m3 caches, descales of 1) with a list ``qscale`` (:data:`QSCALES`, default per tensor).  Classes no
  kernel of the build serves are skipped.
* Each kernel that serves a point (the dispatcher's matching) is timed with CUDA events through
  ``triton.testing.do_bench`` (warm-up, L2 flushed between runs, median of the repeats): the whole plan (a split-KV
  kernel with its combine, the backward's stages); inputs per family: :mod:`.tune_inputs`.
* Before its first timing in a class (and again at its first point of more than one query row) a kernel's output is
  checked against torch SDPA (serving: on each sequence's K/V gathered from the paged cache) (relative Frobenius
  error <= 2e-2); a wrong result or a crash is recorded under ``failed`` and the kernel is not ranked for that class.
* Resumable and incremental: a (point, kernel) already in the table is skipped; the registry is rewritten
  atomically after each class (and when the budget runs out), so a killed run keeps what it measured.
* A table measured on another device (name or arch) is not merged into: it is replaced (``TuneResult.note`` says so).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import subprocess
import time
from typing import Callable, Optional

from fmha_dsl import seqtune
from fmha_dsl.errors import FmhaError, UsageError, error
# FP8_DTYPES: serving classes only (CK's FP8 contract of paged_attention); QSCALES: an FP8 class's descale kinds
from fmha_dsl.kernels.paged_abi import FP8_DTYPES, FP8_QSCALES as QSCALES
from fmha_dsl.registry import Registry, registry_path

from .tune_inputs import (SERVING, BackwardCall, ForwardCall, PagedCall, call_for, make_inputs,  # noqa: F401
                          promise_kept, relative_error, sdpa_reference)

DEFAULT_SHAPES = os.path.join(os.path.dirname(seqtune.__file__), "data", "seqtune_shapes.json")


@dataclasses.dataclass
class TuneResult:
    path: str
    measured: int = 0
    skipped: int = 0
    failed: int = 0
    classes: int = 0
    budget_spent: bool = False
    seconds: float = 0.0
    note: Optional[str] = None
    device: dict = dataclasses.field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------------
# the shape matrix
# ---------------------------------------------------------------------------------------------------------
def load_shapes(path: str | None = None) -> dict:
    p = path or DEFAULT_SHAPES
    try:
        with open(p, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise error("usage.file", f"cannot read the shape matrix `{p}`: {exc.strerror}", None,
                    "pass --shapes FILE (JSON or YAML)", cls=UsageError) from None
    if p.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise error("usage.dependency", "a YAML shape matrix needs PyYAML", None,
                        "pip install 'fmha-dsl[tune]' (or pass a JSON file)", cls=UsageError) from None
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise error("usage.file", f"`{p}` is not valid YAML: {str(exc).splitlines()[0]}", None,
                        "check the file's indentation and quoting", cls=UsageError) from None
    else:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise error("usage.file", f"`{p}` is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
                        None, "check the brackets and commas there (see fmha_dsl/data/seqtune_shapes.json)",
                        cls=UsageError) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("classes"), list):
        raise error("usage.file", f"`{p}`: a shape matrix is an object with a `classes` list", None,
                    "see fmha_dsl/data/seqtune_shapes.json", cls=UsageError)
    doc.setdefault("name", "default" if path is None else os.path.basename(p))
    expand_shapes(doc, p)  # every class checked here, before any GPU work
    return doc


def _list(v):
    return list(v) if isinstance(v, (list, tuple)) else [v]


_DTYPES = ("fp16", "bf16", "fp32", "fp8bf16")
_MASKS = {"no": "no", "none": "no", False: "no", "causal": "causal", "top_left": "causal", True: "causal"}  # 0/1 == False/True


_PAGED_KEYS = ("page_size", "lookup", "kv_layout")   # the fields of serving classes only
_CLASS_KEYS = frozenset({"family", "dtype", "hdim", "hdim_q", "hdim_v", "mask", "lse", "nhead_q", "nhead_k", "seqlens",
                         "seqlens_k", "seqlen_k_ratio", "tokens", "batch", "extra_batches", "qscale", *_PAGED_KEYS})
# a class's `family` field -> the problem family it times.  Serving: paged_attention's problem (batch_prefill), whose
# candidates are the batch_prefill kernels and the split-KV fwd_pagedkv kernels with their combine alike (what the
# dispatcher weighs against each other), so `fwd_pagedkv` (decode shapes, by convention) names the same problem
_FAMILIES = {"fwd": "fwd", "bwd": "bwd_dq_dk_dv", "bwd_dq_dk_dv": "bwd_dq_dk_dv", "batch_prefill": "batch_prefill",
             "fwd_pagedkv": "batch_prefill"}
LOOKUPS = ("vllm", "sglang")
KV_LAYOUTS = ("linear", "vectorized")   # tuned cache layouts (PagedCall converts the linear cache it builds)


def _bad(where: str, i: int, what: str, hint: str | None = None) -> UsageError:
    return error("usage.file", f"shape matrix `{where}`, classes[{i}]: {what}", None,
                 hint or "see fmha_dsl/data/seqtune_shapes.json for the format", cls=UsageError)


def _choice(where, i, name, values, allowed, what, hint) -> list:
    from fmha_dsl.errors import did_you_mean

    for v in values:
        if v not in allowed:
            raise _bad(where, i, f"unknown {name} {v!r} ({what})",
                       (did_you_mean(str(v), list(allowed)) if isinstance(v, str) else None) or hint)
    return values


def _caches(where: str, i: int, c: dict, serving: bool) -> list:
    """A serving class's ``(kv_layout, kv_lookup, page_size)`` combinations (``[None]`` for other classes)."""
    if not serving:
        for key in _PAGED_KEYS:
            if key in c:
                raise _bad(where, i, f"`{key}` is a field of serving classes, not of family "
                           f"{c.get('family', 'fwd')!r}", "give it with \"family\": \"batch_prefill\" (prefill) or "
                           "\"fwd_pagedkv\" (decode): paged_attention's problem over a paged KV cache")
        return [None]
    pages = [_pos_int(where, i, "page_size", p) for p in _list(c.get("page_size", 16))]
    for p in pages:
        if p & (p - 1):
            raise _bad(where, i, f"`page_size` must be a power of two, got {p}", "the serving kernels compile "
                       "pages of 1, 2, 4 ... tokens (kernelsets/serving.fmha builds 1, 16 and 1024)")
    lookups = _choice(where, i, "lookup", _list(c.get("lookup", "vllm")), LOOKUPS,
                      "vllm: a block table; sglang: kv_indptr + kv_indices", "use \"lookup\": [\"vllm\", \"sglang\"]")
    layouts = _choice(where, i, "kv_layout", _list(c.get("kv_layout", "linear")), KV_LAYOUTS,
                      f"tuned layouts: {', '.join(KV_LAYOUTS)}", "use \"kv_layout\": \"linear\" ([num_pages, "
                      "page_size, Hk, D] caches) or \"vectorized\" (CK's 16-byte vectors)")
    return list(itertools.product(layouts, lookups, pages))


def _scales(where: str, i: int, c: dict, dtypes: list) -> list:
    """An FP8 class's ``qscale`` values (default per tensor), with None for its other dtypes; ``[None]`` without
    FP8."""
    fp8 = any(dt in FP8_DTYPES for dt in dtypes)
    if "qscale" in c and not fp8:
        raise _bad(where, i, "`qscale` is a field of FP8 classes (dtype fp8bf16)", "add \"dtype\": \"fp8bf16\" or "
                   "drop `qscale`")
    if not fp8:
        return [None]
    scales = _choice(where, i, "qscale", _list(c.get("qscale", "pertensor")), QSCALES,
                     "pertensor: one descale per tensor; kv_blockscale: one per (page, K/V head); per_token_head: "
                     "one per (token, head)", "use \"qscale\": [\"pertensor\", \"kv_blockscale\", \"per_token_head\"]")
    return scales + ([None] if any(dt not in FP8_DTYPES for dt in dtypes) else [])


def _pos_int(where, i, name, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise _bad(where, i, f"`{name}` must be a positive integer, got {v!r}")
    return v


def expand_shapes(doc: dict, where: str = "<shapes>") -> list[tuple[dict, list[tuple]]]:
    """``[(class dict, [point tuples (seqlen_q, seqlen_k, batch, nhead_q, nhead_k)])]``, sorted, deduplicated.

    Every value is checked: a malformed class is a :class:`UsageError` naming the class and the field.
    """
    out: dict[tuple, tuple[dict, set]] = {}
    for i, c in enumerate(doc["classes"]):
        if not isinstance(c, dict):
            raise _bad(where, i, f"a class is an object, got {type(c).__name__}")
        if "seqlens" not in c:
            raise _bad(where, i, "`seqlens` is missing")
        for key in c:
            if key not in _CLASS_KEYS:
                from fmha_dsl.errors import did_you_mean

                hint = did_you_mean(str(key), sorted(_CLASS_KEYS))
                raise _bad(where, i, f"unknown field `{key}`" + (f" ({hint})" if hint else "") +
                           f"; fields: {', '.join(sorted(_CLASS_KEYS))}")
        if "hdim_q" in c:
            hdims = list(zip(_list(c["hdim_q"]), _list(c.get("hdim_v", c["hdim_q"]))))
        else:
            hdims = []
            for h in _list(c.get("hdim", 128)):
                if isinstance(h, (list, tuple)) and len(h) == 2:
                    hdims.append(tuple(h))
                else:
                    hdims.append((h, h))
        hdims = [(_pos_int(where, i, "hdim", dq), _pos_int(where, i, "hdim", dv)) for dq, dv in hdims]
        family = _FAMILIES.get(c.get("family", "fwd")) if isinstance(c.get("family", "fwd"), str) else None
        if family is None:
            raise _bad(where, i, f"unknown family {c['family']!r} (fwd; bwd: the backward's dq_dk_dv kernels; "
                       "batch_prefill or fwd_pagedkv: paged_attention's serving kernels)")
        serving = family in SERVING
        caches = _caches(where, i, c, serving)
        dtypes = _list(c.get("dtype", "bf16"))
        for dt in dtypes:
            if dt not in _DTYPES:
                raise _bad(where, i, f"unknown dtype {dt!r} (one of {', '.join(_DTYPES)})")
            if dt in FP8_DTYPES and not serving:
                raise _bad(where, i, f"dtype {dt} is the serving kernels' FP8 contract, not one of family "
                           f"{c.get('family', 'fwd')!r}", "give it with \"family\": \"batch_prefill\" or "
                           "\"fwd_pagedkv\" (paged_attention over e4m3 caches)")
        scales = _scales(where, i, c, dtypes)
        masks = []
        for m in _list(c.get("mask", "no")):
            if m not in _MASKS:
                raise _bad(where, i, f"unknown mask {m!r} (no or causal)")
            masks.append(_MASKS[m])
        hq = _pos_int(where, i, "nhead_q", c.get("nhead_q", 16))
        hk = _pos_int(where, i, "nhead_k", c.get("nhead_k", hq))
        if hq % hk:
            raise _bad(where, i, f"`nhead_q` ({hq}) must be a multiple of `nhead_k` ({hk}) (GQA/MQA)")
        lses = _list(c.get("lse", False))
        if any(not isinstance(x, bool) for x in lses):
            raise _bad(where, i, f"`lse` must be true/false (or a list of them), got {c['lse']!r}")
        ratio = c.get("seqlen_k_ratio", 1)
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio <= 0:
            raise _bad(where, i, f"`seqlen_k_ratio` must be a positive number, got {ratio!r}")
        seqlens = [_pos_int(where, i, "seqlens", s) for s in _list(c["seqlens"])]
        seqlens_k = [_pos_int(where, i, "seqlens_k", s) for s in _list(c["seqlens_k"])] if "seqlens_k" in c else None
        if seqlens_k is not None and "seqlen_k_ratio" in c:
            raise _bad(where, i, "give `seqlens_k` or `seqlen_k_ratio`, not both")
        tokens = _pos_int(where, i, "tokens", c.get("tokens", 16384))
        fixed = [_pos_int(where, i, "batch", b) for b in _list(c["batch"])] if "batch" in c else None
        extra = [_pos_int(where, i, "extra_batches", b) for b in _list(c.get("extra_batches", []))]
        grid = [(s, sk) for s in seqlens for sk in seqlens_k or [max(1, int(round(s * float(ratio))))]]
        if serving:
            for s, sk in grid:
                if sk < s:
                    raise _bad(where, i, f"seqlen_k {sk} < seqlen_q {s}: a serving point's queries are the last of "
                               "its sequence's seqlen_k cached tokens", "give `seqlens_k` >= every `seqlens` value")
        for dtype, (dq, dv), mask, lse, cache, qscale in itertools.product(dtypes, hdims, masks, lses, caches,
                                                                            scales):
            if (qscale is None) != (dtype not in FP8_DTYPES):
                continue  # (descales belong to the FP8 dtypes of a class that lists others too)
            cls = {"family": family, "dtype": dtype, "mode": "group" if serving else "batch", "vlayout": "r",
                   "hdim_q": dq, "hdim_v": dv, "mask": mask, "bias": "no",
                   "lse": bool(lse) and family != "bwd_dq_dk_dv", "dropout": False, "logits": False, "sink": False}
            if cache is not None:
                cls.update(zip(seqtune.PAGED_FIELDS, cache))
            if qscale is not None:
                cls["qscale"] = qscale
            _, pts = out.setdefault(seqtune.class_key(cls), (cls, set()))
            for s, sk in grid:
                for b in (fixed if fixed is not None else [max(1, tokens // max(s, sk))]) + extra:
                    pts.add((s, sk, b, hq, hk))
    return [(cls, sorted(pts)) for cls, pts in sorted(out.values(), key=lambda cp: json.dumps(cp[0], sort_keys=True))]


def problem_of(cls: dict, pt: tuple, arch: str | None = None):
    """The dispatcher's :class:`~fmha_dsl.keys.Problem` of one point of ``cls``: a serving class's is the problem
    ``fmha_dsl.paged_attention`` builds (group mode, the maxima given, causal bottom-right aligned, the cache's
    layout, table form and page size, an FP8 class's qscale), so its seqtune class is the one the API's selection
    looks up."""
    from fmha_dsl.keys import Problem

    sq, sk, b, hq, hk = pt
    causal = cls["mask"] == "causal"
    kw = {"mask": "top_left" if causal else "no"}
    if cls["family"] in SERVING:
        kw = {"mask": "bottom_right" if causal else "no", "window_right": 0 if causal else -1, "max_seqlen_q": sq,
              "max_seqlen_k": sk, "paged_kv": True, "kv_layout": cls["kv_layout"], "kv_lookup": cls["kv_lookup"],
              "page_size": cls["page_size"]}
        if "qscale" in cls:  # an FP8 class: its descales' granularity
            kw["qscale"] = cls["qscale"]
    return Problem(family=cls["family"], dtype=cls["dtype"], arch=arch, batch=b, nhead_q=hq, nhead_k=hk,
                   seqlen_q=sq, seqlen_k=sk, hdim_q=cls["hdim_q"], hdim_v=cls["hdim_v"], mode=cls["mode"],
                   vlayout=cls["vlayout"], bias=cls["bias"], lse=cls["lse"], dropout=cls["dropout"],
                   logits=cls["logits"], sink=cls["sink"], **kw)


# ---------------------------------------------------------------------------------------------------------
# the device
# ---------------------------------------------------------------------------------------------------------
def device_info(arch: str) -> dict:
    import torch

    try:
        import triton

        tv = triton.__version__
    except ImportError:
        tv = None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    driver = None
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        driver = getattr(torch.version, "hip", None)
    return {"name": str(torch.cuda.get_device_name()), "arch": arch, "driver": driver, "triton": tv,
            "torch": torch.__version__, "compute_units": int(props.multi_processor_count)}


# ---------------------------------------------------------------------------------------------------------
# tuning
# ---------------------------------------------------------------------------------------------------------

def tune(build_dir: str, shapes: str | None = None, budget: float | None = None, arch: str | None = None,
         progress: Callable[[dict], None] | None = None, warmup_ms: float = 10.0, rep_ms: float = 40.0,
         check_tol: float = 2e-2) -> TuneResult:
    t_start = time.perf_counter()
    doc = load_shapes(shapes)  # a bad matrix is reported before torch, triton or the GPU are touched
    try:
        import torch
        from triton.testing import do_bench
    except ImportError as exc:
        raise error("usage.dependency", f"`fmha-dsl tune` runs kernels on the GPU and needs torch and triton: {exc}",
                    None, "pip install torch triton (on the GPU machine)", cls=UsageError) from None

    from .dispatch import Dispatcher, detect_arch

    if not torch.cuda.is_available():  # a CPU-only torch, or no GPU visible: --arch cannot stand in for one
        raise error("usage.no-gpu", "`fmha-dsl tune` times kernels on a GPU, and torch sees none"
                    + ("" if getattr(torch.version, "cuda", None) or getattr(torch.version, "hip", None)
                       else " (this torch is a CPU-only build)"), None,
                    "run it on the GPU machine, with a CUDA or ROCm build of torch; --arch only picks which of the "
                    "registry's archs to tune there", cls=UsageError)
    path = registry_path(build_dir)
    reg = Registry.load(path)
    if arch is None:
        try:
            arch = detect_arch()
        except FmhaError as exc:  # its hint names the Python argument (arch=); here it is the --arch flag
            raise error(exc.rule, exc.message, None, "pass --arch with the registry arch whose kernels this GPU "
                        "runs (sm80, sm90, gfx942 ...)", cls=UsageError) from None
    dev = device_info(arch)
    res = TuneResult(path=path, device=dev)

    old = seqtune.Table.of(reg)
    table = seqtune.Table(dev, doc["name"])
    if old is not None:
        why = seqtune.device_mismatch(old, arch, dev["name"])
        if why:
            res.note = f"{why}: that table is replaced by this run's measurements"
        else:
            table.merge(old)
    reg.seqtune = None  # the dispatcher ranks nothing while it is being measured
    disp = Dispatcher(reg, arch)

    def save():
        table.store(reg)
        reg.save(path)

    def say(**kw):
        if progress is not None:
            progress(kw)

    classes = expand_shapes(doc)
    for ci, (cls, pts) in enumerate(classes):
        touched, served = False, 0
        # a kernel's output is checked once per class and query kind (one row: decode; more), before its timing
        checked = {(kid, pt[0] > 1) for pt, rec in table.points(cls).items() for kid in rec["times_us"]}
        for pi, pt in enumerate(pts):
            prob = problem_of(cls, pt, arch)
            cands = disp.candidates(prob, promise_kept(cls, pt))
            served = max(served, len(cands))
            todo = [e for e in cands if not table.has(cls, pt, e.identifier)
                    and not table.failed(cls, e.identifier)]
            res.skipped += len(cands) - len(todo)
            if not todo:
                continue
            if budget is not None and time.perf_counter() - t_start > budget:
                res.budget_spent = True
                break
            call = call_for(cls, pt)
            sq, sk, b, hq, hk = pt
            for e in todo:
                if budget is not None and time.perf_counter() - t_start > budget:
                    res.budget_spent = True
                    break
                plan = disp.plan_for(e, prob)
                touched = True
                try:
                    run = call.runner(plan)
                    run()
                    torch.cuda.synchronize()
                    if (e.identifier, sq > 1) not in checked:
                        err = call.error()
                        if not math.isfinite(err) or err > check_tol:
                            raise ValueError(f"wrong result: relative error {err:.3g} vs SDPA at "
                                             f"seqlen {sq}x{sk} batch {b} heads {hq}/{hk}")
                        checked.add((e.identifier, sq > 1))
                    ms = do_bench(run, warmup=warmup_ms, rep=rep_ms, return_mode="median")
                    table.record(cls, pt, e.identifier, ms * 1000.0)
                    res.measured += 1
                    say(event="time", cls=cls, point=pt, kernel=e.name, us=ms * 1000.0, class_index=ci,
                        classes=len(classes), point_index=pi, points=len(pts))
                except Exception as exc:  # noqa: BLE001  (a failing kernel is a result)
                    why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                    table.record(cls, pt, e.identifier, failed=why)
                    res.failed += 1
                    say(event="failed", cls=cls, point=pt, kernel=e.name, why=why, class_index=ci,
                        classes=len(classes))
                    try:
                        torch.cuda.synchronize()
                    except RuntimeError:  # a sticky CUDA error: the context is gone; keep what was measured
                        save()
                        raise
            call = run = None  # free this point's tensors before the next
            if res.budget_spent:
                break
        if touched:
            save()
        res.classes += 1
        say(event="class", cls=cls, class_index=ci, classes=len(classes), kernels=served)
        if res.budget_spent:
            break
    if reg.seqtune is None:  # nothing new measured: still record the device and shape matrix
        save()
    res.seconds = time.perf_counter() - t_start
    return res


__all__ = ["tune", "TuneResult", "load_shapes", "expand_shapes", "problem_of", "device_info", "DEFAULT_SHAPES",
           "BackwardCall", "ForwardCall", "PagedCall", "LOOKUPS", "KV_LAYOUTS"]
