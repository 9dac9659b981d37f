"""Tune a build directory on the GPU: time every compiled kernel over a shape matrix into the seqtune table.

    from fmha_dsl.runtime.tune import tune
    res = tune("build/bench", shapes=None, budget=600, progress=print)   # -> TuneResult; DIR/registry.json updated

* Shape matrix (read, checked and expanded by :mod:`.tune_shapes`): ``fmha_dsl/data/seqtune_shapes.json`` by default;
  ``shapes=`` a JSON file, or YAML (``.yaml``/``.yml``, needs PyYAML: ``pip install fmha-dsl[tune]``). Each entry of
  ``classes`` expands over its lists (``dtype``, ``hdim`` (or ``hdim_q``/``hdim_v`` pairs), ``mask``:
  ``no``/``causal``, optional ``lse``), with points at every ``seqlens`` value: ``seqlen_k`` = seqlen (or
  ``seqlen_k_ratio`` x seqlen, or every value of a ``seqlens_k`` list: decode and chunked prefill); ``batch`` =
  ``tokens // max(seqlen_q, seqlen_k)`` (at least 1) or the ``batch`` list, plus ``extra_batches``;
  ``nhead_q``/``nhead_k``.  ``family``: ``fwd`` (default), ``bwd``, or a serving class, ``batch_prefill`` /
  ``fwd_pagedkv`` (the same problem: ``fmha_dsl.paged_attention``'s, whose candidates are the batch_prefill kernels
  and the split-KV fwd_pagedkv ones with their combine) with lists ``page_size`` (powers of two, default 16),
  ``lookup`` (``vllm``/``sglang``, default vllm) and ``kv_layout`` (:data:`KV_LAYOUTS`) in its class; its points need
  seqlen_k >= seqlen_q.  A serving class may take dtype ``fp8bf16`` (e4m3 caches, descales of 1) with a list
  ``qscale`` (:data:`QSCALES`, default per tensor).  Classes no kernel of the build serves are skipped.
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
import math
import subprocess
import time
from typing import Callable, Optional

from fmha_dsl import seqtune
from fmha_dsl.errors import FmhaError, UsageError, error
from fmha_dsl.registry import Registry, registry_path

from .tune_inputs import BackwardCall, ForwardCall, PagedCall, call_for, promise_kept
# the shape matrix (re-exported: fmha_dsl.runtime.tune.load_shapes etc. are what callers use)
from .tune_shapes import (DEFAULT_SHAPES, KV_LAYOUTS, LOOKUPS, QSCALES, expand_shapes, load_shapes,  # noqa: F401
                          problem_of)


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

def _check_arch(arch, reg) -> None:
    """An --arch the registry has kernels for (a table recorded for another would serve no kernel)."""
    if arch in reg.archs:
        return
    from fmha_dsl.errors import did_you_mean

    raise error("usage.arch", f"--arch {arch!r}: the registry has kernels for {', '.join(reg.archs) or 'none'}",
                None, did_you_mean(str(arch), list(reg.archs)) or "pass one of the registry's archs", cls=UsageError)


def tune(build_dir: str, shapes: str | None = None, budget: float | None = None, arch: str | None = None,
         progress: Callable[[dict], None] | None = None, warmup_ms: float = 10.0, rep_ms: float = 40.0,
         check_tol: float = 2e-2) -> TuneResult:
    t_start = time.perf_counter()
    if arch is not None and not str(arch).strip():  # `--arch "$ARCH"` with ARCH unset: not "the GPU's"
        raise error("usage.arch", "--arch names no arch: got ''", None,
                    "leave --arch out for the GPU's own, or name one of the registry's (sm80, sm90, gfx942 ...)",
                    cls=UsageError)
    doc = load_shapes(shapes)  # a bad matrix is reported before torch, triton or the GPU are touched
    path = registry_path(build_dir)
    reg = Registry.load(path)   # (so is a missing or damaged registry)
    if arch is not None:
        _check_arch(arch, reg)
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
    if arch is None:
        try:
            arch = detect_arch()
        except FmhaError as exc:  # its hint names the Python argument (arch=); here it is the --arch flag
            raise error(exc.rule, exc.message, None, "pass --arch with the registry arch whose kernels this GPU "
                        "runs (sm80, sm90, gfx942 ...)", cls=UsageError) from None
    _check_arch(arch, reg)
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
           "BackwardCall", "ForwardCall", "PagedCall", "LOOKUPS", "KV_LAYOUTS", "QSCALES"]
