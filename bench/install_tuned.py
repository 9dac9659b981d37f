"""Write the shipped first-use table of a device from a measured cache table (bench/retune_shipped.py's ``--out``, or
``$FMHA_DSL_CACHE_DIR/tuned/<arch>__<device>.json`` copied from a device run).

    python bench/install_tuned.py MEASURED.json [--into fmha_dsl/data/tuned/sm90_nvidia-h200.json]
                                  [--keys-of OLD.json] --provenance TEXT

Keeps the decisions that were timed over at least ``--min-timed`` candidates (a GPU test's reduced candidate list
must not ship) and, with ``--keys-of``, only the keys that table has; records device, date, torch and Triton.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("measured")
    ap.add_argument("--into", default="fmha_dsl/data/tuned/sm90_nvidia-h200.json")
    ap.add_argument("--keys-of", default=None)
    ap.add_argument("--min-timed", type=int, default=5)
    ap.add_argument("--provenance", required=True)
    ap.add_argument("--torch", default="2.11.0+cu130")
    ap.add_argument("--triton", default="3.6.0")
    args = ap.parse_args()
    with open(args.measured) as f:
        got = json.load(f)
    dec = got["decisions"]
    if args.keys_of:
        with open(args.keys_of) as f:
            want = set(json.load(f)["decisions"])
        dec = {k: v for k, v in dec.items() if k in want}
        missing = sorted(want - set(dec))
        if missing:
            print(f"{len(missing)} keys of {args.keys_of} were not measured, e.g. {missing[0]}")
    dec = {k: v for k, v in sorted(dec.items()) if len(v.get("times_us", {})) >= args.min_timed}
    doc = {"arch": got["arch"], "date": time.strftime("%Y-%m-%d"), "device": got["device"],
           "provenance": args.provenance, "torch": args.torch, "triton": args.triton, "version": got["version"],
           "decisions": dec}
    from fmha_dsl.registry import write_atomic

    write_atomic(args.into, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.into}: {len(dec)} decisions")


if __name__ == "__main__":
    main()
