"""Measured selection vs the alternatives, on shapes the tuning never saw.

    python bench/bench_select.py --build DIR [--json OUT.json] [--budget SECONDS] [--skip-tune]

1. ``fmha-dsl tune DIR`` on the default matrix (``fmha_dsl/data/seqtune_shapes.json``), resumable.
2. Held-out shapes per class (bf16/fp16 x head dim 64/128 x causal or not): prefill at other seqlens (384 ... 12288,
   16k tokens per batch), other batches (1 and 3 at 1536 / 6144), GQA 16/4 and MQA 16/1; for the unmasked classes
   also decode / chunked prefill at other lengths (1 ... 128 query rows, 2k / 8k keys, batch 4 / 32, GQA 16/4).  Every kernel serving a shape is timed
   (do_bench: warm-up, L2 flush, median) after a check against SDPA: the exhaustive best.
3. Per shape, the choice of: the seqtune table (``Dispatcher.select``), the cost model (same registry, table
   removed), CK's first-fit rule (``fmha_dsl.seqtune.ck_first_fit``, among the ``fwd`` kernels: CK's forward API does
   not consider split-KV kernels), and the best single fixed kernel of the class
   (the one kernel with the lowest geomean over the class's shapes, chosen with hindsight).
   regret = t(choice) / t(best) - 1, geomean over shapes; gain = geomean t(fixed) / t(seqtune) - 1.
Goals (issue 4): seqtune regret <= 3 %, gain over the best fixed kernel >= 10 %.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings

HELD_SEQLENS = (384, 768, 1536, 3072, 6144, 12288)
TOKENS, HEADS = 16384, 16


DECODE_Q = (1, 8, 32, 128)   # new query rows (decode, speculative decode, chunked prefill)
DECODE_K = (2048, 8192)       # cached keys


def held_out(cls):
    """Shapes the default matrix never measured: prefill (square) for every class, decode / chunked prefill
    (few query rows against a long cache) for the unmasked classes.  Each point: (sq, sk, batch, hq, hk)."""
    for s in HELD_SEQLENS:
        yield (s, s, max(1, TOKENS // s), HEADS, HEADS)
    for s in (1536, 6144):
        for b in (1, 3):
            yield (s, s, b, HEADS, HEADS)
    for s in (768, 3072):
        for hk in (4, 1):
            yield (s, s, max(1, TOKENS // s), HEADS, hk)
    if cls["mask"] != "no":
        return
    for sq in DECODE_Q:
        for sk in DECODE_K:
            for b in (4, 32):
                yield (sq, sk, b, HEADS, HEADS)
    for sq in (1, 32):
        yield (sq, 8192, 8, HEADS, 4)  # GQA decode


def kind(pt) -> str:
    return "prefill" if pt[0] == pt[1] else "decode"


def geomean(xs):
    xs = [x for x in xs if x and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--json", default=None)
    ap.add_argument("--budget", type=float, default=900.0, help="seconds of tuning at most (resumable)")
    ap.add_argument("--skip-tune", action="store_true")
    ap.add_argument("--dtypes", default="bf16,fp16")
    args = ap.parse_args()

    import torch
    from triton.testing import do_bench

    from fmha_dsl import seqtune
    from fmha_dsl.registry import Registry
    from fmha_dsl.runtime.dispatch import Dispatcher
    from fmha_dsl.runtime.tune import expand_shapes, load_shapes, problem_of, tune
    from fmha_dsl.runtime.tune_inputs import make_inputs, relative_error, sdpa_reference

    tune_info = None
    if not args.skip_tune:
        t0 = time.perf_counter()
        res = tune(args.build, budget=args.budget,
                   progress=lambda ev: ev["event"] == "class" and print(
                       f"tuned class {ev['class_index'] + 1}/{ev['classes']}", file=sys.stderr, flush=True))
        tune_info = {"measured": res.measured, "skipped": res.skipped, "failed": res.failed,
                     "seconds": round(time.perf_counter() - t0, 1), "budget_spent": res.budget_spent,
                     "device": res.device}
        print(f"tune: {tune_info}", file=sys.stderr, flush=True)

    path = os.path.join(args.build, "registry.json")
    disp_tab = Dispatcher(path)
    if disp_tab.table is None:
        print(f"warning: no usable seqtune table ({disp_tab.table_note})", file=sys.stderr)
    reg_plain = Registry.load(path)
    reg_plain.seqtune = None
    disp_cost = Dispatcher(reg_plain, disp_tab.arch, root=args.build)

    rows = []
    classes = [c for c, _ in expand_shapes(load_shapes())   # the forward classes (the matrix has others too)
               if c["family"] == "fwd" and c["dtype"] in args.dtypes.split(",")]
    for cls in classes:
        for pt in held_out(cls):
            prob = problem_of(cls, pt, disp_tab.arch)
            cands = disp_tab.candidates(prob)
            if not cands:
                continue
            q, k, v, out, lse, kw = make_inputs(cls, pt)
            sq, sk, b, hq, hk = pt
            ref = sdpa_reference(q, k, v, cls, pt)
            times = {}
            for e in cands:
                plan = disp_tab.plan_for(e, prob)

                def run(plan=plan):
                    plan.run(q, k, v, out, lse, **kw)

                try:
                    run()
                    torch.cuda.synchronize()
                    err = relative_error(out, ref)
                    if not math.isfinite(err) or err > 2e-2:
                        continue
                    times[e.identifier] = do_bench(run, warmup=10, rep=40, return_mode="median") * 1000.0
                except Exception as exc:  # noqa: BLE001
                    print(f"  {e.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            if not times:
                q = k = v = out = lse = ref = None
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pick_tab = disp_tab.select(prob).identifier
                pick_cost = disp_cost.select(prob).identifier
            # CK's forward API chooses among forward kernels only (split-KV is a separate call in CK)
            pick_ck = seqtune.ck_first_fit(prob, [e for e in cands if e.sig["family"] == "fwd"] or cands).identifier
            best = min(times, key=times.get)
            name = {e.identifier: e.name for e in cands}
            row = {"class": cls, "point": list(pt), "times_us": {name[i]: t for i, t in times.items()},
                   "best": name[best], "best_us": times[best]}
            for tag, pick in (("seqtune", pick_tab), ("cost_model", pick_cost), ("ck_first_fit", pick_ck)):
                row[tag] = {"kernel": name[pick], "us": times.get(pick),
                            "ratio": times[pick] / times[best] if pick in times else None}
            rows.append(row)
            print(f"{cls['dtype']} d{cls['hdim_q']} {cls['mask']:6} s={sq:>5}x{sk:<5} b={b:>3} h={hq}/{hk}: best "
                  f"{times[best]:9.1f} us  seqtune x{row['seqtune']['ratio'] or float('nan'):.3f}  cost "
                  f"x{row['cost_model']['ratio'] or float('nan'):.3f}  ck x{row['ck_first_fit']['ratio'] or float('nan'):.3f}",
                  flush=True)
            q = k = v = out = lse = ref = None  # free this point's tensors before the next
            torch.cuda.empty_cache()

    # the best single fixed kernel per class (with hindsight), over the shapes it serves and was timed on
    by_class: dict[str, list] = {}
    for r in rows:
        by_class.setdefault(json.dumps(r["class"], sort_keys=True), []).append(r)
    for key in sorted(by_class):
        mine = by_class[key]
        kernels = sorted(set.intersection(*(set(r["times_us"]) for r in mine)))
        if not kernels:
            continue
        fixed = min(kernels, key=lambda kn: (geomean([r["times_us"][kn] / r["best_us"] for r in mine]), kn))
        for r in mine:
            r["fixed"] = {"kernel": fixed, "us": r["times_us"][fixed]}
    def subset(rs):
        return {"shapes": len(rs),
                "seqtune_regret": geomean([r["seqtune"]["ratio"] for r in rs]) - 1,
                "cost_model_regret": geomean([r["cost_model"]["ratio"] for r in rs]) - 1,
                "ck_first_fit_regret": geomean([r["ck_first_fit"]["ratio"] for r in rs]) - 1,
                "fixed_regret": geomean([r["fixed"]["us"] / r["best_us"] for r in rs if "fixed" in r]) - 1,
                "gain_over_best_fixed": geomean([r["fixed"]["us"] / r["seqtune"]["us"] for r in rs
                                                 if "fixed" in r and r["seqtune"]["us"]]) - 1,
                # picks that failed or were not timed are left out of the geomeans above: counted here
                "untimed_picks": {t: sum(1 for r in rs if r[t]["us"] is None)
                                  for t in ("seqtune", "cost_model", "ck_first_fit")}}

    summary = {**subset(rows), "seqtune_picks_best": sum(1 for r in rows if r["seqtune"]["kernel"] == r["best"]),
               "by_kind": {k: subset([r for r in rows if kind(r["point"]) == k]) for k in ("prefill", "decode")}}
    print("\n| selection | geomean regret vs exhaustive best |\n|---|---|")
    for tag in ("seqtune", "cost_model", "ck_first_fit", "fixed"):
        print(f"| {tag} | {100 * summary[tag + '_regret']:.1f} % |")
    for k, sub in summary["by_kind"].items():
        if sub["shapes"]:
            print(f"{k}: {sub['shapes']} shapes, seqtune regret {100 * sub['seqtune_regret']:.1f} %, cost model "
                  f"{100 * sub['cost_model_regret']:.1f} %, CK first-fit {100 * sub['ck_first_fit_regret']:.1f} %, "
                  f"gain over the class's fixed kernel {100 * sub['gain_over_best_fixed']:+.1f} %")
    print(f"\nseqtune vs best single fixed kernel per class: {100 * summary['gain_over_best_fixed']:+.1f} % "
          f"(goal >= 10 %); seqtune regret goal <= 3 %; {summary['seqtune_picks_best']}/{len(rows)} shapes exact; "
          f"picks without a timing (left out above): {summary['untimed_picks']}")
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "tune": tune_info, "summary": summary, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
