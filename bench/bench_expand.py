"""Benchmark: parse + expand + validate + write the registry of ck_receipt0.fmha, whole process.

    python bench/bench_expand.py [--arch gfx950] [--repeat 5]

Times `fmha-dsl build ck_receipt0 --arch ARCH -o TMP` as a fresh process (interpreter start and
imports included), reports the median, kernels/s, and the ratio to CK's upstream generator
(`generate.py --list_blobs`, about 76 s for gfx950 and 58 s for gfx942 on a 2-core machine of our CI's
kind: shared/oracle/README.md).  Then an in-process breakdown by stage.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

CK_SECONDS = {"gfx950": 76.0, "gfx942": 58.0}


def whole_process(arch: str, repeat: int, jobs: int) -> tuple[float, list[float], int]:
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeat):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "fmha_dsl.cli", "build", "ck_receipt0", "--arch", arch,
                            "-o", tmp, "-q", "-j", str(jobs)], check=True)
            times.append(time.perf_counter() - t0)
        with open(os.path.join(tmp, "registry.json")) as f:
            n = json.load(f)["metadata"]["total_kernels"]
    return statistics.median(times), times, n


def stages(arch: str) -> dict:
    import fmha_dsl

    out = {}
    t = time.perf_counter()
    ks = fmha_dsl.load(fmha_dsl.shipped("ck_receipt0"))
    out["parse+resolve"] = time.perf_counter() - t
    t = time.perf_counter()
    rep = ks.expand_report(arch=arch)
    out["expand+rules"] = time.perf_counter() - t
    t = time.perf_counter()
    reg = ks.registry(arch, report=rep)
    out["registry"] = time.perf_counter() - t
    t = time.perf_counter()
    text = reg.to_json()
    out["json"] = time.perf_counter() - t
    out["json_bytes"] = len(text)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="gfx950")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    ck = CK_SECONDS.get(args.arch)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    for jobs in sorted({1, os.cpu_count() or 1}):
        med, times, n = whole_process(args.arch, args.repeat, jobs)
        print(f"fmha-dsl build ck_receipt0 --arch {args.arch} -j {jobs}: {n} kernels")
        print(f"  whole process, median of {len(times)}: {med:.3f} s  (runs: {', '.join(f'{t:.3f}' for t in times)})")
        print(f"  {n / med:,.0f} kernels/s")
        if ck:
            print(f"  CK generate.py (upstream, same machine kind): ~{ck:.0f} s -> {ck / med:.0f}x faster")
    print("in-process stages, serial:")
    for k, v in stages(args.arch).items():
            print(f"  {k:<14} {v:.3f} s" if k != "json_bytes" else f"  {k:<14} {v:,}")


if __name__ == "__main__":
    main()
