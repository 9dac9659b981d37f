"""Tune a build directory on the GPU: time every compiled kernel over a shape matrix into the seqtune table.

    from fmha_dsl.runtime.tune import tune
    res = tune("build/bench", shapes=None, budget=600, progress=print)   # -> TuneResult; DIR/registry.json updated

* Shape matrix: ``fmha_dsl/data/seqtune_shapes.json`` by default; ``shapes=`` a JSON file, or YAML
  (``.yaml``/``.yml``, needs PyYAML: ``pip install fmha-dsl[tune]``).  Each entry of ``classes`` expands over its
  lists (``dtype``, ``hdim`` (or ``hdim_q``/``hdim_v`` pairs), ``mask``: ``no``/``causal``, optional ``lse``),
  with points at every ``seqlens`` value: ``seqlen_k`` = seqlen (or ``seqlen_k_ratio`` x seqlen, or every value of
  a ``seqlens_k`` list: decode and chunked prefill); ``batch`` = ``tokens // max(seqlen_q, seqlen_k)`` (at least 1)
  or the ``batch`` list, plus ``extra_batches``; ``nhead_q``/``nhead_k``.
* Each kernel that serves a point (the dispatcher's matching) is timed with CUDA events through
  ``triton.testing.do_bench`` (warm-up, L2 flushed between runs, median of the repeats).
* Before its first timing in a class a kernel's output is checked against torch SDPA (relative Frobenius error
  <= 2e-2); a wrong result or a crash is recorded under ``failed`` and the kernel is not ranked for that class.
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
from fmha_dsl.registry import Registry, registry_path

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


_DTYPES = ("fp16", "bf16", "fp32")
_MASKS = {"no": "no", "none": "no", False: "no", "causal": "causal", "top_left": "causal", True: "causal"}  # 0/1 == False/True


_CLASS_KEYS = frozenset({"family", "dtype", "hdim", "hdim_q", "hdim_v", "mask", "lse", "nhead_q", "nhead_k", "seqlens",
                         "seqlens_k", "seqlen_k_ratio", "tokens", "batch", "extra_batches"})
_FAMILIES = {"fwd": "fwd", "bwd": "bwd_dq_dk_dv", "bwd_dq_dk_dv": "bwd_dq_dk_dv"}  # a class's `family` field


def _bad(where: str, i: int, what: str) -> UsageError:
    return error("usage.file", f"shape matrix `{where}`, classes[{i}]: {what}", None,
                 "see fmha_dsl/data/seqtune_shapes.json for the format", cls=UsageError)


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
        family = _FAMILIES.get(c.get("family", "fwd"))
        if family is None:
            raise _bad(where, i, f"unknown family {c['family']!r} (fwd, or bwd: the backward's dq_dk_dv kernels)")
        dtypes = _list(c.get("dtype", "bf16"))
        for dt in dtypes:
            if dt not in _DTYPES:
                raise _bad(where, i, f"unknown dtype {dt!r} (one of {', '.join(_DTYPES)})")
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
        for dtype, (dq, dv), mask, lse in itertools.product(dtypes, hdims, masks, lses):
            cls = {"family": family, "dtype": dtype, "mode": "batch", "vlayout": "r", "hdim_q": dq,
                   "hdim_v": dv, "mask": mask, "bias": "no", "lse": bool(lse) and family == "fwd", "dropout": False,
                   "logits": False, "sink": False}
            _, pts = out.setdefault(seqtune.class_key(cls), (cls, set()))
            for s in seqlens:
                for sk in seqlens_k or [max(1, int(round(s * float(ratio))))]:
                    for b in (fixed if fixed is not None else [max(1, tokens // max(s, sk))]) + extra:
                        pts.add((s, sk, b, hq, hk))
    return [(cls, sorted(pts)) for cls, pts in sorted(out.values(), key=lambda cp: json.dumps(cp[0], sort_keys=True))]


def problem_of(cls: dict, pt: tuple, arch: str | None = None):
    from fmha_dsl.keys import Problem

    sq, sk, b, hq, hk = pt
    return Problem(family=cls["family"], dtype=cls["dtype"], arch=arch, batch=b, nhead_q=hq, nhead_k=hk,
                   seqlen_q=sq, seqlen_k=sk, hdim_q=cls["hdim_q"], hdim_v=cls["hdim_v"], mode=cls["mode"],
                   vlayout=cls["vlayout"], mask="top_left" if cls["mask"] == "causal" else "no", bias=cls["bias"],
                   lse=cls["lse"], dropout=cls["dropout"], logits=cls["logits"], sink=cls["sink"])


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

def make_inputs(cls: dict, pt, seed: int = 0):
    """Random q, k, v (fixed seed), an output, the LSE buffer the class needs, and the causal run-time
    arguments, for one measured point ``(seqlen_q, seqlen_k, batch, nhead_q, nhead_k)`` on the GPU."""
    import torch

    sq, sk, b, hq, hk = pt
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[cls["dtype"]]
    torch.manual_seed(seed)
    q = torch.randn(b, hq, sq, cls["hdim_q"], device="cuda", dtype=dt)
    k = torch.randn(b, hk, sk, cls["hdim_q"], device="cuda", dtype=dt)
    v = torch.randn(b, hk, sk, cls["hdim_v"], device="cuda", dtype=dt)
    out = q.new_empty(b, hq, sq, cls["hdim_v"])
    lse = torch.empty(b, hq, sq, device="cuda", dtype=torch.float32) if cls["lse"] else None
    kw = {"window": (-1, 0), "bottom_right": False} if cls["mask"] == "causal" else {}
    return q, k, v, out, lse, kw


def sdpa_reference(q, k, v, cls: dict, pt):
    """torch SDPA's output for one shape-matrix point, in fp32 (what every timed kernel is checked against)."""
    import torch.nn.functional as F

    hq, hk = pt[3], pt[4]
    return F.scaled_dot_product_attention(q, k, v, is_causal=cls["mask"] == "causal", enable_gqa=hq != hk).float()


class BackwardCall:
    """One shape-matrix point of a backward class: inputs, the forward's out and LSE (``fmha_dsl.attention``),
    gradient buffers, and SDPA's gradients as the check (computed on first use)."""

    def __init__(self, cls: dict, pt):
        import torch

        self.q, self.k, self.v, _, _, _ = make_inputs(cls, pt)
        self.cls, self.pt = cls, pt
        self.causal = cls["mask"] == "causal"
        self.out, self.lse = _forward(self.q, self.k, self.v, self.causal)
        self.dout = torch.randn_like(self.out)
        self.grads = (torch.empty_like(self.q), torch.empty_like(self.k), torch.empty_like(self.v))
        self.kw = {"window": (-1, 0), "bottom_right": False} if self.causal else {}

    def runner(self, plan):
        args = (self.q, self.k, self.v, self.out, self.lse, self.dout) + self.grads

        def run():
            plan.run(*args, **self.kw)
        return run

    def error(self) -> float:
        """The largest relative error of dQ, dK, dV against SDPA's autograd (fp32)."""
        import torch

        q, k, v = (x.detach().float().requires_grad_() for x in (self.q, self.k, self.v))
        ref = sdpa_reference(q, k, v, self.cls, self.pt)
        want = torch.autograd.grad(ref, (q, k, v), self.dout.float())
        return max(relative_error(g, w) for g, w in zip(self.grads, want))


def _forward(q, k, v, causal: bool, heads_per_step: int = 4):
    """``(out, lse)`` of the forward in fp32 torch arithmetic (top-left causal or none), a few heads at a time: what a
    backward kernel's arguments need, without a forward kernel in the registry being tuned."""
    import torch

    b, hq, sq, d = q.shape
    g = hq // k.shape[1]
    out = torch.empty(b, hq, sq, v.shape[-1], device=q.device, dtype=q.dtype)
    lse = torch.empty(b, hq, sq, device=q.device, dtype=torch.float32)
    sk = k.shape[2]
    keep = torch.ones(sq, sk, device=q.device, dtype=torch.bool).tril() if causal else None
    for bi in range(b):
        for h0 in range(0, hq, heads_per_step):
            hs = slice(h0, min(hq, h0 + heads_per_step))
            kv = [x[bi].repeat_interleave(g, 0)[hs].float() for x in (k, v)]
            s = q[bi, hs].float() @ kv[0].transpose(-1, -2) / math.sqrt(d)
            if keep is not None:
                s = s.masked_fill(~keep, float("-inf"))
            m = torch.logsumexp(s, -1)
            lse[bi, hs] = m
            out[bi, hs] = (torch.exp(s - m[..., None]) @ kv[1]).to(q.dtype)
    return out, lse


def relative_error(out, ref) -> float:
    """``|out - ref| / |ref|`` (Frobenius), NaN-propagating; 0/0 counts as 0."""
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


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
        touched = False
        checked: set[str] = {kid for rec in table.points(cls).values() for kid in rec["times_us"]}
        for pi, pt in enumerate(pts):
            prob = problem_of(cls, pt, arch)
            cands = disp.candidates(prob)
            todo = [e for e in cands if not table.has(cls, pt, e.identifier)
                    and not table.failed(cls, e.identifier)]
            res.skipped += len(cands) - len(todo)
            if not todo:
                continue
            if budget is not None and time.perf_counter() - t_start > budget:
                res.budget_spent = True
                break
            backward = cls["family"] != "fwd"
            if backward:
                call = BackwardCall(cls, pt)
            else:
                q, k, v, out, lse, kw = make_inputs(cls, pt)
            sq, sk, b, hq, hk = pt
            ref = None
            for e in todo:
                if budget is not None and time.perf_counter() - t_start > budget:
                    res.budget_spent = True
                    break
                plan = disp.plan_for(e, prob)
                if backward:
                    run = call.runner(plan)
                else:
                    def run(plan=plan):
                        plan.run(q, k, v, out, lse, **kw)

                touched = True
                try:
                    run()
                    torch.cuda.synchronize()
                    if e.identifier not in checked:
                        if backward:
                            err = call.error()
                        else:
                            if ref is None:
                                ref = sdpa_reference(q, k, v, cls, pt)
                            err = relative_error(out, ref)
                        if not math.isfinite(err) or err > check_tol:
                            raise ValueError(f"wrong result: relative error {err:.3g} vs SDPA at "
                                             f"seqlen {sq}x{sk} batch {b} heads {hq}/{hk}")
                        checked.add(e.identifier)
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
            q = k = v = out = lse = ref = call = None  # free this point's tensors before the next
            if res.budget_spent:
                break
        if touched:
            save()
        res.classes += 1
        say(event="class", cls=cls, class_index=ci, classes=len(classes))
        if res.budget_spent:
            break
    if reg.seqtune is None:  # nothing new measured: still record the device and shape matrix
        save()
    res.seconds = time.perf_counter() - t_start
    return res


__all__ = ["tune", "TuneResult", "load_shapes", "expand_shapes", "problem_of", "device_info", "DEFAULT_SHAPES",
           "BackwardCall"]
