"""Driver launch cost against the number of kernel parameters (what bounds the dispatch overhead).

    python3 -P bench/bench_launch.py      (needs nvcc, cuda-python and a GPU; prints a table, writes $OUT JSON)

Empty kernels taking 0 ... 53 eight-byte parameters are compiled with nvcc, loaded with cuda-python and launched
through fmha-dsl's native launcher and through cuda-python's cuLaunchKernel; each variant is timed on the host
(median of 5000 launches, best of 3 rounds), with torch's own launch of a tiny elementwise kernel as a peer.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

COUNTS = (0, 8, 16, 32, 53)


def source() -> str:
    out = []
    for n in COUNTS:
        params = ", ".join(f"unsigned long long a{i}" for i in range(n))
        out.append(f'extern "C" __global__ void k{n}({params}) {{}}')
    return "\n".join(out) + "\n"


def timed(fn, calls=5000, warmup=500):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    clock = time.perf_counter_ns
    for _ in range(calls):
        t0 = clock()
        fn()
        ts.append(clock() - t0)
    torch.cuda.synchronize()
    return statistics.median(ts) / 1000


def main() -> int:
    import ctypes

    import torch

    from fmha_dsl.runtime import native
    from fmha_dsl.runtime.cuda import check, driver, primary_context

    torch.zeros(1, device="cuda")
    d = driver()
    primary_context(0)
    cap = torch.cuda.get_device_capability()
    with tempfile.TemporaryDirectory() as tmp:
        cu, cubin = os.path.join(tmp, "k.cu"), os.path.join(tmp, "k.cubin")
        open(cu, "w").write(source())
        subprocess.run(["nvcc", "-cubin", f"-arch=sm_{cap[0]}{cap[1]}", cu, "-o", cubin], check=True)
        data = open(cubin, "rb").read()
    mod = check(d.cuModuleLoadData(data), "cuModuleLoadData")
    nat = native.load()
    addr = native.driver_launch_address()
    stream = torch.cuda.current_stream().cuda_stream
    rows = {}
    for n in COUNTS:
        fn = check(d.cuModuleGetFunction(mod, f"k{n}".encode()), "cuModuleGetFunction")
        L = nat.Launcher(addr, int(fn), 128, 0, b"Q" * max(n, 1), 0) if n else None
        args = [0] * n
        buf = (ctypes.c_uint64 * max(n, 1))()
        slots = (ctypes.c_void_p * max(n, 1))(*[ctypes.addressof(buf) + 8 * i for i in range(max(n, 1))])
        pslots = ctypes.addressof(slots)
        hs = d.CUstream(stream)
        launch = d.cuLaunchKernel
        best = {}
        for _ in range(3):
            if L is not None:
                t = timed(lambda: L.launch(1, 1, 1, stream, args))
                best["native"] = min(best.get("native", 1e9), t)
            t = timed(lambda: launch(fn, 1, 1, 1, 128, 1, 1, 0, hs, pslots if n else 0, 0))
            best["cuda-python"] = min(best.get("cuda-python", 1e9), t)
        rows[n] = best
    x = torch.zeros(1, device="cuda")
    peer = min(timed(lambda: x.add_(1)) for _ in range(3))
    print(f"device {torch.cuda.get_device_name()}; torch x.add_(1) (one launch through torch): {peer:.2f} us")
    print(f"{'params':>6} {'native us':>10} {'cuda-python us':>15}")
    for n, r in rows.items():
        print(f"{n:>6} {r.get('native', float('nan')):10.2f} {r['cuda-python']:15.2f}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_launch.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch_add_us": peer, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
