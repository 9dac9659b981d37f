"""How long the first call of a problem class takes, in the situations a user meets (issue 12's first-call goals).

    python bench/bench_firstcall.py [--quick] [--situations A,B] [--json OUT.json]

Each situation is a fresh Python process calling the public API as a user does -- ``fmha_dsl.attention(q, k, v,
causal=...)`` for the forward classes, the same with ``requires_grad`` and ``.backward()`` for the training classes
-- and reports, per class, the first call's wall time (synchronised), the second call's, and how many candidate
kernels first use timed.  The processes run in this order, the later ones reusing the earlier ones' cache folder:

* ``shipped_new_machine``: the package's tables on (the default), an empty cache -- a fresh machine of a model whose
  decisions ship: the shipped winner and its close runners-up compile, and those within 6 % are timed again here.
* ``shipped_kernels_cached_no_confirm``: the same cache with this device's own decisions deleted and
  ``FMHA_DSL_TUNED_CONFIRM=0``: the shipped winner, loaded, untimed.
* ``shipped_kernels_cached``: the same, confirmation on (the default) -- a deployment that shipped its kernel cache
  (``fmha-dsl precompile``) but not its decisions: first use loads and times the finalists, compiles
  nothing.
* ``shipped_confirmed``: the cache as the previous process left it: the decisions are read, nothing is timed.
* ``never_seen``: shipped tables off (``FMHA_DSL_TUNED_SHIPPED=0``), an empty cache: every candidate the rules
  allow compiles (on this host's cores) and is timed -- a device whose model has no shipped table.
* ``never_seen_cached``: the same cache: kernels and decisions cached.

The first class of each process also pays Triton's import and the start of the compile workers (later classes
reuse the workers while they wait idle); it is reported like the others and marked ``first_in_process``.  Before
any class, each process runs one tiny torch backward and reports its time (``torch_first_backward_s``): torch
imports its symbolic-shapes module (and sympy) on a process's first ``.backward()`` whatever the model calls --
2.1-2.6 s on the GPU machine, whose site-packages hold no cached bytecode -- and that one-off is torch's, not a
first call's.  Triton's
own cache (``TRITON_CACHE_DIR``) lives in each situation's cache folder, so a situation that starts from an empty
folder starts from a cold Triton cache too.  Times are host wall-clock seconds around one call and a
``torch.cuda.synchronize()``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TOKENS, HEADS = 16384, 16
# (dtype, head dim, causal, seqlen); batch = TOKENS // seqlen
FWD = [("bf16", 128, True, 4096), ("bf16", 128, False, 1024), ("bf16", 64, True, 2048), ("bf16", 64, False, 8192),
       ("fp16", 128, True, 16384), ("fp16", 64, False, 4096)]
BWD = [("bf16", 128, True, 4096), ("bf16", 64, False, 1024), ("fp16", 128, False, 2048)]
QUICK_FWD, QUICK_BWD = FWD[:2], BWD[:1]

SITUATIONS = [  # (name, extra environment, delete this device's own decisions first)
    ("shipped_new_machine", {}, False),
    ("shipped_kernels_cached_no_confirm", {"FMHA_DSL_TUNED_CONFIRM": "0"}, True),
    ("shipped_kernels_cached", {}, True),
    ("shipped_confirmed", {}, False),
    ("never_seen", {"FMHA_DSL_TUNED_SHIPPED": "0"}, False),
    ("never_seen_cached", {"FMHA_DSL_TUNED_SHIPPED": "0"}, False),
]


def child(spec: dict) -> None:
    """One process: every class of ``spec`` called twice; one JSON line per class on stdout."""
    t0 = time.perf_counter()
    import torch

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    import fmha_dsl
    from fmha_dsl.api_dispatch import dispatcher

    t2 = time.perf_counter()
    x = torch.ones(2, device="cuda", requires_grad=True)  # torch's own first backward: any library's user pays it
    (x * 2).backward(torch.ones_like(x))
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    print(json.dumps({"torch_cuda_init_s": round(t1 - t0, 3), "import_fmha_dsl_s": round(t2 - t1, 3),
                      "torch_first_backward_s": round(t3 - t2, 3)}), flush=True)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}
    for n, (kind, dtype, d, causal, s) in enumerate(spec["classes"]):
        b = TOKENS // s
        train = kind == "bwd"
        q, k, v = (torch.randn(b, HEADS, s, d, device="cuda", dtype=dt[dtype], requires_grad=train)
                   for _ in range(3))
        do = torch.randn_like(q) if train else None

        seen = dict(dispatcher(None, 0).measured) if n else {}
        a = time.perf_counter()
        _call(fmha_dsl, torch, q, k, v, do, causal)
        first = time.perf_counter() - a
        a = time.perf_counter()
        _call(fmha_dsl, torch, q, k, v, do, causal)
        second = time.perf_counter() - a
        measured = dispatcher(None, 0).measured
        timed = {key: len(times) for key, times in measured.items() if key not in seen}
        print(json.dumps({"kind": kind, "dtype": dtype, "d": d, "causal": causal, "seqlen": s, "batch": b,
                          "first_call_s": round(first, 4), "second_call_s": round(second, 5),
                          "timed": timed, "first_in_process": n == 0}), flush=True)
        del q, k, v, do
        torch.cuda.empty_cache()


def _call(fmha_dsl, torch, q, k, v, do, causal: bool) -> None:
    """One user call: the forward, and with ``do`` given its backward too; synchronised."""
    o = fmha_dsl.attention(q, k, v, causal=causal)
    if do is not None:
        o.backward(do)
        q.grad = k.grad = v.grad = None
    torch.cuda.synchronize()


# the knobs a situation sets; the caller's own values of them would change what a situation measures
_SITUATION_KNOBS = ("FMHA_DSL_TUNED_SHIPPED", "FMHA_DSL_TUNED_CONFIRM", "FMHA_DSL_AUTOTUNE", "FMHA_DSL_NO_BUILD")


def run_situation(name: str, env_extra: dict, cache: str, classes: list, timeout: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _SITUATION_KNOBS}
    # Triton's own cache lives with ours: a situation that starts from an empty folder starts from a cold Triton too
    env.update(FMHA_DSL_CACHE_DIR=cache, TRITON_CACHE_DIR=os.path.join(cache, "triton"), **env_extra)
    spec = json.dumps({"classes": classes})
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-P", os.path.abspath(__file__), "--child", spec], capture_output=True,
                           text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return {"error": f"timed out after {timeout:.0f} s", "rows": _rows(out)}
    got = {"wall_s": round(time.perf_counter() - t0, 2), "rows": _rows(r.stdout)}
    if r.returncode:
        got["error"] = r.stderr[-800:]
    return got


def _rows(text: str) -> list:
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows


def summarize(sit: dict) -> dict:
    rows = [r for r in sit.get("rows", []) if "first_call_s" in r]
    out = {}
    for kind in ("fwd", "bwd"):
        xs = [r["first_call_s"] for r in rows if r["kind"] == kind]
        rest = [r["first_call_s"] for r in rows if r["kind"] == kind and not r["first_in_process"]]
        if xs:
            out[kind] = {"median_s": round(statistics.median(xs), 3), "max_s": max(xs), "n": len(xs),
                         "median_s_not_first_in_process": round(statistics.median(rest), 3) if rest else None,
                         "max_s_not_first_in_process": max(rest) if rest else None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="two forward classes and one backward class")
    ap.add_argument("--json", default=None)
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per process")
    ap.add_argument("--situations", default=",".join(n for n, _, _ in SITUATIONS),
                    help="comma-separated, from: %(default)s (each reuses what the ones before it left: run a later "
                         "one with those it follows)")
    args = ap.parse_args()
    if args.child is not None:
        child(json.loads(args.child))
        return
    wanted = args.situations.split(",")
    unknown = sorted(set(wanted) - {n for n, _, _ in SITUATIONS})
    if unknown:
        ap.error(f"--situations: unknown {', '.join(unknown)}; known: {', '.join(n for n, _, _ in SITUATIONS)}")
    for later, first in (("shipped_kernels_cached", "shipped_new_machine"),
                         ("shipped_kernels_cached_no_confirm", "shipped_new_machine"),
                         ("never_seen_cached", "never_seen")):
        if later in wanted and first not in wanted:
            ap.error(f"--situations: {later} measures what {first} leaves in the cache; add {first}")
    recorded = "shipped_kernels_cached" in wanted or (
        "shipped_new_machine" in wanted and "shipped_kernels_cached_no_confirm" not in wanted)
    if "shipped_confirmed" in wanted and not recorded:
        ap.error("--situations: shipped_confirmed reads the decisions shipped_kernels_cached (or shipped_new_machine "
                 "without the no-confirm situation, which deletes them) records; add it")
    import torch

    fwd, bwd = (QUICK_FWD, QUICK_BWD) if args.quick else (FWD, BWD)
    classes = [["fwd", *c] for c in fwd] + [["bwd", *c] for c in bwd]
    doc = {"device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
           "python": platform.python_version(), "cpus": os.cpu_count(), "situations": {}}
    try:
        import triton

        doc["triton"] = triton.__version__
    except ImportError:
        pass
    shipped_cache, fresh_cache = tempfile.mkdtemp(prefix="fmha-first-"), tempfile.mkdtemp(prefix="fmha-never-")
    for name, env_extra, forget in SITUATIONS:
        if name not in wanted:
            continue
        cache = fresh_cache if name.startswith("never") else shipped_cache
        if forget:
            shutil.rmtree(os.path.join(cache, "tuned"), ignore_errors=True)
        sit = run_situation(name, env_extra, cache, classes, args.timeout)
        sit["summary"] = summarize(sit)
        doc["situations"][name] = sit
        for r in sit["rows"]:
            if "first_call_s" in r:
                print(f"{name:34s} {r['kind']} {r['dtype']} d{r['d']} {'causal' if r['causal'] else 'full  '} "
                      f"S{r['seqlen']:>5}: first {r['first_call_s']:7.3f} s  second {r['second_call_s']:.4f} s  "
                      f"timed {sum(r['timed'].values())}", flush=True)
        print(f"{name}: {json.dumps(sit['summary'])}{'  ERROR ' + sit['error'] if 'error' in sit else ''}",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
