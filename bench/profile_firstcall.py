"""Where the host time of a first call goes.

    python3 -P bench/profile_firstcall.py [--top 30]
    python3 -P bench/profile_firstcall.py --empty [--torch-fast 1,0] [--train]

Default: a first process fills a fresh cache folder (``FMHA_DSL_CACHE_DIR``) by calling a forward class and a
training (forward + backward) class; a second, fresh process calls them again under ``cProfile`` and prints, per
call, the wall time and the functions with the most cumulative time.  bench_firstcall.py measured 2.3 s for the
first training call of a process with everything cached (H100, session 35); this says where it goes.

``--empty``: one fresh process per ``--torch-fast`` value (``FMHA_DSL_TORCH_FAST``), an empty cache and no shipped
table, calls bench_firstcall.py's first two forward classes and prints a timeline of each first call: every batch
of compile jobs (jobs, workers, when each result came back), the timing of the candidates, and the torch fast
path's background build.  bench_firstcall.py measured the second class at 12-14 s where the first took 5-6 s (H100,
session 35); this says which phase takes it.  ``--train`` adds a never-seen training step (forward and backward)
after them, with a profile of its backward's main thread (session 40: where a 10 s first training step went).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

_CHILD = r"""
import cProfile, io, pstats, sys, time, torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
import fmha_dsl
top = int(sys.argv[1])
def fwd():
    q, k, v = (torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fmha_dsl.attention(q, k, v, causal=True); torch.cuda.synchronize()
def train():
    q, k, v = (torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    o = fmha_dsl.attention(q, k, v, causal=True); o.backward(torch.randn_like(o)); torch.cuda.synchronize()
for name, f in (("forward", fwd), ("training step", train), ("training step again", train)):
    if not top:
        f(); continue
    pr = cProfile.Profile(); t = time.perf_counter(); pr.enable(); f(); pr.disable()
    print(f"== {name}: {time.perf_counter() - t:.3f} s", flush=True)
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(top)
    print(s.getvalue()[-12000:])
"""


_TIMELINE = r"""
import sys, time, torch
T0 = time.perf_counter()
def now():
    return f"{time.perf_counter() - T0:7.2f}s"
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
import fmha_dsl
from fmha_dsl import build_triton
from fmha_dsl.runtime import autotune, torch_fast
print(now(), "torch and fmha_dsl imported", flush=True)
if sys.argv[1] == "train":  # torch's own first backward (it imports sympy), which any model's first step pays
    x = torch.ones(2, device="cuda", requires_grad=True); (x * 2).backward(torch.ones_like(x))
    print(now(), "torch's first backward done", flush=True)

def wrap(mod, name, label):
    f = getattr(mod, name)
    def timed(*a, **k):
        t = time.perf_counter()
        print(now(), label, "starts", flush=True)
        try:
            return f(*a, **k)
        finally:
            print(now(), label, f"ends after {time.perf_counter() - t:.2f}s", flush=True)
    setattr(mod, name, timed)

isolated = build_triton.run_isolated
def run_isolated(fn, jobs, workers, on_result):
    t = time.perf_counter()
    print(now(), f"compile: {len(jobs)} jobs on {workers} workers", flush=True)
    def what(job):
        kind, sig, alg = job[:3]
        if kind != "kernel" or not alg:
            return f"{kind} {sig.get('family')}"
        return f"{sig.get('family')} {alg.get('pipeline')} {'x'.join(map(str, alg.get('tile', ())[:2]))}"
    def got(i, res):
        print(now(), f"  job {i} {'ok' if res[0] is not None else 'FAILED'} ({what(jobs[i])}) "
              f"at +{time.perf_counter() - t:.2f}s", flush=True)
        on_result(i, res)
    isolated(fn, jobs, workers, got)
    print(now(), f"compile done after {time.perf_counter() - t:.2f}s", flush=True)
build_triton.run_isolated = run_isolated
wrap(autotune.MeasuredSelection, "_measured", "timing the candidates")
load = torch_fast.load
wrap(torch_fast, "load", "torch fast path build/load (background thread)")
CALLS = ((4, 16, 4096, 128, True, False), (16, 16, 1024, 128, False, False))
if sys.argv[1] == "train":  # after the forward calls, as bench_firstcall.py orders them
    CALLS += ((4, 16, 4096, 128, True, True),)
for b, h, s, d, causal, train in CALLS:
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=train) for _ in range(3))
    print(now(), f"== first {'training step' if train else 'call'}: b{b} h{h} S={s} d{d} causal={causal}", flush=True)
    t = time.perf_counter(); o = fmha_dsl.attention(q, k, v, causal=causal)
    if train:
        print(now(), f"== forward returned after {time.perf_counter() - t:.2f}s", flush=True)
        import cProfile, io, pstats
        pr = cProfile.Profile(); pr.enable(); o.backward(torch.randn_like(o)); torch.cuda.synchronize(); pr.disable()
        prof = io.StringIO(); pstats.Stats(pr, stream=prof).sort_stats("cumulative").print_stats(40)
        print(now(), "== the backward's profile (its main thread):", prof.getvalue()[-9000:], flush=True)
    torch.cuda.synchronize()
    print(now(), f"== done after {time.perf_counter() - t:.2f}s", flush=True)
torch_fast.wait(120)
torch_fast.load = load  # the check below is not the build
print(now(), "torch fast path:", torch_fast.available(), flush=True)
"""


def timeline(torch_fast: list[str], train: bool = False) -> None:
    """``--empty``: the timeline of two never-seen first calls (``train``: then a training step, forward and
    backward), in a fresh process with an empty cache, per value of ``FMHA_DSL_TORCH_FAST``."""
    for tf in torch_fast:
        cache = tempfile.mkdtemp(prefix="fmha-prof-")
        env = dict(os.environ, FMHA_DSL_CACHE_DIR=cache, TRITON_CACHE_DIR=os.path.join(cache, "triton"),
                   FMHA_DSL_TUNED_SHIPPED="0", FMHA_DSL_TORCH_FAST=tf)
        print(f"#### FMHA_DSL_TORCH_FAST={tf}, empty cache, no shipped table", flush=True)
        try:
            r = subprocess.run([sys.executable, "-P", "-c", _TIMELINE, "train" if train else "fwd"], env=env,
                               capture_output=True, text=True, timeout=600)
            print(r.stdout[-30000:], r.stderr[-3000:] if r.returncode else "", flush=True)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            print(f"timed out after {exc.timeout:.0f} s:", out[-30000:], flush=True)
        finally:
            shutil.rmtree(cache, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--empty", action="store_true", help="timeline of never-seen first calls (empty cache)")
    ap.add_argument("--torch-fast", default="1,0", help="--empty: the FMHA_DSL_TORCH_FAST values, one process each")
    ap.add_argument("--train", action="store_true", help="--empty: a never-seen training step (forward and "
                    "backward) after the two forward calls")
    args = ap.parse_args()
    if args.empty:
        timeline(args.torch_fast.split(","), args.train)
        return
    env = dict(os.environ, FMHA_DSL_CACHE_DIR=tempfile.mkdtemp(prefix="fmha-prof-"))
    for top in (0, args.top):   # fill the cache, then profile a fresh process
        r = subprocess.run([sys.executable, "-P", "-c", _CHILD, str(top)], env=env, capture_output=True, text=True)
        print(r.stdout[-30000:], r.stderr[-3000:] if r.returncode else "", flush=True)


if __name__ == "__main__":
    main()
