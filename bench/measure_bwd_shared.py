"""The shared memory (LDS) Triton's builds of the backward kernels take, per arch: the candidates first use would
build for a plain problem (batch mode, no mask, bias or dropout; every tile and staged pipeline, both dQ routes) of
each head dim, with the rules' shared-memory check off, compiled on this machine (no GPU needed) -- for the rules'
bound (``fmha_dsl/rules/triton_bwd.py``'s ``smem_bytes``) and its test (tests/test_build_triton.py).

    python bench/measure_bwd_shared.py --arch sm90 --arch gfx942 [--dtype fp16 --dtype fp32] [--unaligned] [-j 16]
                                       [--cache-dir DIR] --json OUT.json

Writes ``{"triton": version, "archs": {arch: [[dtype, hdim_q, hdim_v, [BLOCK_M, BLOCK_N], warps, pipeline,
deterministic, shared bytes], ...]}}`` (``--unaligned``: builds for arguments without the alignment promises, under
``"archs_unaligned"``); kernels that fail to compile are listed on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

HDIMS = ((32, 32), (64, 64), (128, 128), (192, 128), (256, 256))   # 80 and 96 build as 128, 160 as 256


def measure(arch: str, dtypes, jobs: int, cache_dir: str, aligned: bool = True) -> list[list]:
    import fmha_dsl.build_triton as bt
    import fmha_dsl.rules.triton_bwd as rules
    from fmha_dsl.cache import ArtifactCache
    from fmha_dsl.first_use import Builder
    from fmha_dsl.keys import Problem

    saved = rules.smem_bytes, bt._over_shared
    rules.smem_bytes, bt._over_shared = (lambda b: 0), (lambda meta, arch: None)   # every tile, every build
    try:
        wanted, what = {}, {}
        for dtype in dtypes:
            for hq, hv in HDIMS:
                p = Problem(family="bwd_dq_dk_dv", dtype=dtype, hdim_q=hq, hdim_v=hv, seqlen_q=4096, seqlen_k=4096)
                for e in Builder().candidates(p, arch, aligned, limit=10_000):
                    key, job = bt.kernel_job(e.sig, e.alg, arch, aligned)
                    wanted[key] = job
                    what[key] = [dtype, hq, hv, list(e.alg["tile"][:2]), e.alg["wave"][0], e.alg["pipeline"],
                                 e.sig["deterministic"]]
        ready, why = bt.compile_through_cache(wanted, ArtifactCache.of(cache_dir), jobs)
    finally:
        rules.smem_bytes, bt._over_shared = saved
    for key in sorted(set(what) - set(ready)):
        print(f"{arch}: {what[key]} did not compile: {why.get(key, '')[:200]}", file=sys.stderr)
    return sorted((what[k] + [int(ready[k][0].get("shared") or 0)] for k in ready), key=str)


def main() -> int:
    from fmha_dsl.arch import backend_archs

    archs = backend_archs("triton")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", action="append", required=True, choices=archs, help="a Triton target (repeatable)")
    ap.add_argument("--dtype", action="append", default=None, choices=("fp16", "bf16", "fp32"))
    ap.add_argument("--unaligned", action="store_true", help="builds for arguments without alignment promises")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", required=True)
    ap.add_argument("--cache-dir", default=None, help="the artifact cache to compile through (default: a fresh one)")
    args = ap.parse_args()
    if args.jobs < 1:
        ap.error(f"-j/--jobs: must be a whole number >= 1, not {args.jobs}")
    try:  # before the compiles: an unwritable path fails now, not after them
        with open(args.json, "a"):
            pass
    except OSError as exc:
        ap.error(f"--json: cannot write {args.json}: {exc.strerror}")
    import triton

    with tempfile.TemporaryDirectory() as fresh:
        cache = args.cache_dir or fresh
        doc = {"triton": triton.__version__,
               "archs_unaligned" if args.unaligned else "archs":
                   {a: measure(a, args.dtype or ["fp16"], args.jobs, cache, not args.unaligned) for a in args.arch}}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=0)
    print(json.dumps({a: len(rows) for part in list(doc.values())[1:] for a, rows in part.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
