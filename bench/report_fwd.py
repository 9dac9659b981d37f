"""Markdown table and geomeans from bench_fwd.py JSON files (one with --peers sdpa, one with --peers flex).

    python bench/report_fwd.py bench/results/<sdpa>.json bench/results/<flex>.json
"""

from __future__ import annotations

import json
import math
import sys


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main(paths) -> None:
    rows = {}
    meta = None
    for p in paths:
        with open(p) as f:
            doc = json.load(f)
        meta = meta or doc
        for r in doc["rows"]:
            key = (r["dtype"], r["hdim"], r["causal"], r["seqlen"])
            cur = rows.setdefault(key, {"best_runs": []})
            if "best" in r:
                cur["best_runs"].append(r["best"]["tflops"])
                cur.setdefault("best_name", r["best"]["name"])
            for peer in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flex"):
                if peer in r and "tflops" in r[peer]:
                    cur[peer] = r[peer]["tflops"]
                    cur[peer + "_best"] = r["best"]["tflops"] if "best" in r else None
    print(f"Device: {meta['device']}; torch {meta['torch']}; Triton {meta['triton']}; {meta['date']}\n")
    print("| dtype | d | mask | seqlen | batch | best-in-set | SDPA flash | cuDNN | efficient | Flex | "
          "best/flash | best/cuDNN | best/Flex |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = {"sdpa_flash": [], "sdpa_cudnn": [], "flex": []}
    lose = {"sdpa_flash": [], "flex": []}
    for key in sorted(rows, key=lambda k: (k[0], k[1], k[2], k[3])):
        r = rows[key]
        cells = []
        for peer in ("sdpa_flash", "sdpa_cudnn", "flex"):
            if peer in r and r.get(peer + "_best"):
                ratio = r[peer + "_best"] / r[peer]   # ratio within the run that measured the peer
                ratios[peer].append(ratio)
                if peer in lose and ratio < 1.0:
                    lose[peer].append((key, ratio))
                cells.append(f"{ratio:.2f}")
            else:
                cells.append("-")
        dtype, d, causal, s = key
        best = max(r["best_runs"]) if r["best_runs"] else float("nan")
        fmt = lambda p: f"{r[p]:.0f}" if p in r else "-"  # noqa: E731
        print(f"| {dtype} | {d} | {'causal' if causal else 'none'} | {s} | {16384 // s} | {best:.0f} | "
              f"{fmt('sdpa_flash')} | {fmt('sdpa_cudnn')} | {fmt('sdpa_efficient')} | {fmt('flex')} | "
              + " | ".join(cells) + " |")
    print()
    for peer, xs in ratios.items():
        if not xs:
            print(f"- {peer}: not measured in these files")
            continue
        print(f"- geomean best-in-set / {peer}: {geomean(xs):.3f} over {len(xs)} shapes; "
              f"min {min(xs):.3f}, max {max(xs):.3f}")
    for peer, xs in lose.items():
        print(f"- shapes where best-in-set < {peer}: {len(xs)}" + (": " + ", ".join(
            f"{k[0]} d{k[1]} {'causal' if k[2] else 'full'} s{k[3]} ({x:.3f})" for k, x in xs) if xs else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
