"""Can first use's confirmation of a shipped decision settle less and decide as well?

Session 34's ``runtime.race.confirm`` timed a shipped decision's winner and its close runners-up each after 0.2 s
of back-to-back launches of itself (then those within 3 % again, in reverse order, as long): about 0.2 s per
finalist per round, a second or more of a class's first call.  The GPU is already under load after the first
finalist's settle, so the others may need a shorter one (``race.confirm`` since session 35: 50 ms).  For prefill and training classes whose shipped record has close
runners-up, first use runs through the public API with ``runtime.autotune.confirm`` wrapped: on the very plans and
timer first use made, it times

* ``s200``: 0.2 s settle for every finalist and round (session 34's ``race.confirm``);
* ``chain``: 0.2 s for the first finalist, ``--next-ms`` for the others and for the second round;
* ``truth``: each finalist after 0.5 s of itself, 0.2 s of timed launches (at most 400), in order and then in
  reverse order (the mean of the two medians) -- what a long run of it reads,

each variant twice, and prints each variant's pick, its regret against ``truth`` and its wall time.  First use confirms on a board at rest (after compiling): the
variants run after ``--idle-s`` seconds of an idle GPU each, and which of them goes first alternates from one
confirmation to the next (session 35's run 3 ran s200, chain, truth, chain, s200 back to back, so only s200's first
repeat started from rest).  ``--max-classes`` counts confirmations (a training class makes two: its forward with
LSE and its backward).

    python3 -P bench/probe_confirm.py [--next-ms 50] [--idle-s 2] [--max-classes 8] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import time

TOKENS, HEADS = 16384, 16
CASES = [("fwd", dt, d, c, s) for s in (4096, 2048, 8192, 16384) for d in (128, 64) for c in (True, False)
         for dt in ("bf16", "fp16")]
CASES = [("bwd", "bf16", 128, True, 4096), ("bwd", "fp16", 128, False, 2048)] + CASES


def variant(race, measure, plans: dict, first_settle: float, next_settle: float) -> dict:
    """Confirm's algorithm (``race._sustained``) with the first finalist's settle and the others' given apart: the
    pick, the medians and the wall time."""
    t0 = time.perf_counter()
    first = race._first_times(measure, plans)
    ids = sorted(first, key=lambda i: (first[i], i))
    med = race._sustained(measure, plans, ids, first, first_settle, next_settle) if ids else {}
    if not med:
        raise RuntimeError("no finalist could be timed")
    return {"pick": min(med, key=lambda i: (med[i], i)), "us": med, "first_us": first,
            "wall_s": time.perf_counter() - t0}


def truth(race, measure, plans: dict) -> dict:
    first = race._first_times(measure, plans)
    out = {i: [] for i in first}
    order = sorted(first)
    for seq in (order, order[::-1]):
        for i in seq:
            t = max(first[i], 1.0)
            got = race._time_n(measure, plans[i], int(min(400, max(8, 0.2e6 / t))), int(min(20000, 0.5e6 / t)))
            if got:
                out[i].append(race._median(got))
    return {i: sum(v) / len(v) for i, v in out.items() if v}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--next-ms", type=float, default=50.0)
    ap.add_argument("--max-classes", type=int, default=8, help="stop after this many confirmations")
    ap.add_argument("--idle-s", type=float, default=2.0, help="idle GPU time before each variant (first use confirms "
                    "on a board at rest)")
    ap.add_argument("--budget-s", type=float, default=200.0, help="start no new class after this many seconds")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    import fmha_dsl
    import fmha_dsl.runtime.autotune as autotune
    from fmha_dsl.runtime import race

    log: list = []

    def hooked(measure, plans):
        if min(race._first_times(measure, plans).values(), default=0) < race.SUSTAIN_MIN_US:
            return race.confirm(measure, plans)   # short kernels: confirmed in bursts, no settle to probe
        rec = {"n": len(plans)}
        settles = {"s200": race.CONFIRM_SETTLE_SECONDS, "chain": args.next_ms / 1000}
        order = ["s200", "chain"] if len(log) % 2 == 0 else ["chain", "s200"]
        runs = {name: [] for name in settles}
        try:
            for name in order + order[::-1]:
                time.sleep(args.idle_s)
                runs[name].append(variant(race, measure, plans, race.CONFIRM_SETTLE_SECONDS, settles[name]))
        except RuntimeError:   # nothing could be timed: first use's own answer, nothing logged
            return race.confirm(measure, plans)
        rec["truth"] = truth(race, measure, plans)
        rec["variants"] = runs
        rec["first"] = order[0]
        rec["names"] = {i: getattr(getattr(p, "entry", None), "name", None) or str(i) for i, p in plans.items()}
        log.append(rec)
        got = runs["s200"][0]
        return got["pick"], {**got["first_us"], **got["us"]}, got["us"]

    autotune.confirm = hooked
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}
    t_start = time.perf_counter()
    results = []
    for kind, dtype, d, causal, s in CASES:
        if len(results) >= args.max_classes or time.perf_counter() - t_start > args.budget_s:
            break
        b = TOKENS // s
        train = kind == "bwd"
        q, k, v = (torch.randn(b, HEADS, s, d, device="cuda", dtype=dt[dtype], requires_grad=train) for _ in range(3))
        before = len(log)
        o = fmha_dsl.attention(q, k, v, causal=causal)
        if train:
            o.backward(torch.randn_like(o))
        torch.cuda.synchronize()
        for rec in log[before:]:
            # a training class confirms two decisions: its forward with LSE, then its backward
            part = "backward" if any(str(n).startswith("fmha_bwd") for n in rec["names"].values()) else (
                "forward with LSE" if train else "forward")
            tag = f"{kind} {dtype} d{d} {'causal' if causal else 'full'} S{s} [{part}]"
            tr = rec["truth"]
            if not tr or any(got["pick"] not in tr for runs in rec["variants"].values() for got in runs):
                print(f"{tag}: a finalist could not be timed; left out", flush=True)
                continue
            best = min(tr.values())
            row = {"class": tag, "n": rec["n"], "truth_us": tr, "names": rec["names"]}
            line = [f"{tag}: {rec['n']} finalists, truth best {best:.1f} us, spread {max(tr.values()) / best - 1:.1%}"]
            for vname, runs in rec["variants"].items():
                for r, got in enumerate(runs):
                    reg = tr[got["pick"]] / best - 1
                    row[f"{vname}{r + 1}"] = {"regret": reg, "wall_s": got["wall_s"], "pick": got["pick"],
                                              "us": got["us"]}
                    line.append(f"   {vname}#{r + 1}: regret {reg:6.2%}  wall {got['wall_s']:.2f} s")
            results.append(row)
            print("\n".join(line), flush=True)
        del q, k, v, o
        torch.cuda.empty_cache()
    summary = {}
    for vname in ("s200", "chain"):
        for r in (1, 2):
            rows = [x[f"{vname}{r}"] for x in results if f"{vname}{r}" in x]
            if rows:
                summary[f"{vname}{r}"] = {
                    "max_regret": max(x["regret"] for x in rows),
                    "mean_regret": sum(x["regret"] for x in rows) / len(rows),
                    "median_wall_s": sorted(x["wall_s"] for x in rows)[len(rows) // 2],
                    "max_wall_s": max(x["wall_s"] for x in rows), "n": len(rows)}
    print(json.dumps(summary, indent=1), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d"),
                       "next_ms": args.next_ms, "cache": os.environ.get("FMHA_DSL_CACHE_DIR"),
                       "rows": results, "summary": summary}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
