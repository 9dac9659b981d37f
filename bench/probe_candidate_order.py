"""Where the shipped tables' winners fall in the cost model's candidate order (no GPU needed).

    python bench/probe_candidate_order.py [--family fwd,bwd_dq_dk_dv] [--first 8,12,16,20,24] [--beyond-matrix]

For every class of the tuning shape matrix (``fmha_dsl/data/seqtune_shapes.json``) that a shipped table
(``fmha_dsl/data/tuned/*.json``) decided under the current candidate space, this finds the measured winner's
position in the order first use compiles and times the candidates (:meth:`fmha_dsl.first_use.Builder.candidates`,
the cost model's ranking), and the regret had first use timed only the first N: the fastest time the record holds
among those N over the record's fastest, both by the race's timing (``times_us``; a candidate the race pruned
counts as slower than all it kept; the finalists' sustained times are left out, as the race timed only some).  It
says how far the candidate count could be cut, on a machine whose first use compiles in rounds of its core count.
Positions count from 0.

``--beyond-matrix``: the table's other keys instead (decode, GQA, head dims and flags the shape matrix lacks, each
rebuilt by bench/retune_shipped.py's ``problem_of``), with the cut first use makes: the regret of what it times,
where the record timed those candidates.
"""

from __future__ import annotations

import argparse
import collections
import statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="fwd,bwd_dq_dk_dv", help="comma-separated families (default: %(default)s)")
    ap.add_argument("--first", default="8,12,16,20,24", help="the candidate counts N to report")
    ap.add_argument("--beyond-matrix", action="store_true", help="the keys outside the shape matrix, first use's cut")
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
    if args.beyond_matrix:
        return beyond_matrix(b, families, {decisions.key(problem_of(c, pt, "sm90"), True) for c, pts in classes
                                           for pt in pts})
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


def beyond_matrix(b, families, matrix: set) -> None:
    """The regret of first use's own cut on the shipped keys outside the shape matrix."""
    import os
    import sys

    from fmha_dsl.keys import Problem
    from fmha_dsl.runtime import autotune, decisions

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from retune_shipped import problem_of

    for device, table in sorted(decisions.shipped_tables("sm90").items()):
        for fam in families:
            regrets, left = [], 0
            for k in sorted(table):
                c = problem_of(k) if k.split(".")[0] == fam and k not in matrix else None
                rec = autotune.current_record(table.get(k), b, fam) if c else None
                times = (rec or {}).get("times_us")
                if not times:
                    left += c is not None
                    continue
                p = Problem(family=fam, dtype=c["dtype"], mode=c["mode"], batch=c["batch"], nhead_q=c["hq"],
                            nhead_k=c["hk"], seqlen_q=c["sq"], seqlen_k=c["sk"], hdim_q=c["dq"], hdim_v=c["dv"],
                            mask="top_left" if c["causal"] else "no", lse=c["lse"], deterministic=c["deterministic"])
                got = [times[e.name] for e in b.candidates(p, "sm90", True) if e.name in times]
                regrets.append(min(got) / min(times.values()) - 1 if got else float("inf"))
            if regrets:
                print(f"{device} {fam} beyond the matrix: {len(regrets)} keys ({left} without timings), first use's "
                      f"cut: mean regret {100 * statistics.mean(regrets):.2f} %, max {100 * max(regrets):.1f} %, "
                      f"keys > 3 %: {sum(r > 0.03 for r in regrets)}")


if __name__ == "__main__":
    main()
