"""Where the shipped tables' winners fall in the cost model's candidate order (no GPU needed).

    python bench/probe_candidate_order.py [--family fwd,bwd_dq_dk_dv] [--first 8,12,16,20,24]

For every class of the tuning shape matrix (``fmha_dsl/data/seqtune_shapes.json``) that a shipped table
(``fmha_dsl/data/tuned/*.json``) decided under the current candidate space, this finds the measured winner's
position in the order first use compiles and times the candidates (:meth:`fmha_dsl.first_use.Builder.candidates`,
the cost model's ranking), and the regret had first use timed only the first N: the fastest time the record holds
among those N over the record's fastest, both by the race's timing (``times_us``; a candidate the race pruned
counts as slower than all it kept; the finalists' sustained times are left out, as the race timed only some).  It
says how far the candidate count could be cut, on a machine whose first use compiles in rounds of its core count.
Positions count from 0.
"""

from __future__ import annotations

import argparse
import collections
import statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="fwd,bwd_dq_dk_dv", help="comma-separated families (default: %(default)s)")
    ap.add_argument("--first", default="8,12,16,20,24", help="the candidate counts N to report")
    args = ap.parse_args()
    from fmha_dsl.first_use import Builder
    from fmha_dsl.runtime import autotune, decisions
    from fmha_dsl.runtime.tune_shapes import expand_shapes, load_shapes, problem_of

    families = args.family.split(",")
    try:
        firsts = [int(n) for n in args.first.split(",")]
    except ValueError:
        ap.error(f"--first: comma-separated whole numbers, not {args.first!r}")
    unknown = sorted(set(args.family.split(",")) - {"fwd", "bwd_dq_dk_dv"})
    if unknown:
        ap.error(f"--family: the shipped tables decide fwd and bwd_dq_dk_dv, not {', '.join(unknown)}")
    b = Builder(None, 1)
    classes = [(cls, pts) for cls, pts in expand_shapes(load_shapes(None)) if cls["family"] in families]
    for device, table in sorted(decisions.shipped_tables("sm90").items()):
        ranks, seen = collections.defaultdict(list), set()
        regrets = collections.defaultdict(lambda: {n: [] for n in firsts})
        for cls, pts in classes:
            for pt in pts:
                p = problem_of(cls, pt, "sm90")
                k = decisions.key(p, True)
                rec = autotune.current_record(table.get(k), b, p.family)
                if k in seen or rec is None:
                    continue
                seen.add(k)
                order = [e.name for e in b.candidates(p, "sm90", True, limit=autotune.ALL_CANDIDATES)]
                times = rec.get("times_us", {})  # one timing method: the race's, every candidate it kept
                if rec.get("kernel") not in order or not times:
                    continue
                ranks[p.family].append(order.index(rec["kernel"]))
                best = min(times.values())
                for n in firsts:
                    got = [times[x] for x in order[:n] if x in times]
                    regrets[p.family][n].append(min(got) / best - 1 if got else float("inf"))
        for fam in families:
            rs = sorted(ranks[fam])
            if not rs:
                continue
            print(f"{device} {fam}: {len(rs)} classes, winner's position in the order: median {statistics.median(rs)}, "
                  f"range {rs[0]}-{rs[-1]}")
            for n in firsts:
                xs = regrets[fam][n]
                print(f"    first {n:2d} timed: mean regret {100 * statistics.mean(xs):6.2f} %, max "
                      f"{100 * max(xs):6.1f} %, classes > 3 %: {sum(x > 0.03 for x in xs)} of {len(xs)}")


if __name__ == "__main__":
    main()
