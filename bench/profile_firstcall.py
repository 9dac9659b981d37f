"""Where the host time of a first call goes once its kernels and decision are cached.

    python3 -P bench/profile_firstcall.py [--top 30]

A first process fills a fresh cache folder (``FMHA_DSL_CACHE_DIR``) by calling a forward class and a training
(forward + backward) class; a second, fresh process calls them again under ``cProfile`` and prints, per call, the
wall time and the functions with the most cumulative time.  bench_firstcall.py measured 2.3 s for the first
training call of a process with everything cached (H100, session 35); this says where it goes.
"""

from __future__ import annotations

import argparse
import os
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    env = dict(os.environ, FMHA_DSL_CACHE_DIR=tempfile.mkdtemp(prefix="fmha-prof-"))
    for top in (0, args.top):   # fill the cache, then profile a fresh process
        r = subprocess.run([sys.executable, "-P", "-c", _CHILD, str(top)], env=env, capture_output=True, text=True)
        print(r.stdout[-30000:], r.stderr[-3000:] if r.returncode else "", flush=True)


if __name__ == "__main__":
    main()
