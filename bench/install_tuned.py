"""Write the shipped first-use table of a device from a measured cache table (bench/retune_shipped.py's ``--out``, or
``$FMHA_DSL_CACHE_DIR/tuned/<arch>__<device>.json`` copied from a device run).

    python bench/install_tuned.py MEASURED.json [MEASURED2.json ...] [--into fmha_dsl/data/tuned/sm90_nvidia-h200.json]
                                  [--keys-of OLD.json] [--family FAMILY [--merge]] --provenance TEXT
    python bench/install_tuned.py --restamp --measured-at REV [--into TABLE] --provenance TEXT

Keeps the decisions that were timed over at least ``--min-timed`` candidates (a GPU test's reduced candidate list
must not ship) and, with ``--keys-of``, only the keys that table has; records device, date, torch and Triton.
Several measured tables (one device run each) are merged.  ``--family F`` replaces only family F's decisions of
``--into`` (the measured tables' other decisions are ignored, the table's other families kept as they are) and
appends ``--provenance`` to the table's provenance; with ``--merge`` only the measured keys of F are replaced (after
``bench/retune_shipped.py --with-candidate``).

``--restamp`` measures nothing: it carries a table's decisions over to the current candidate space (each decision's
``space`` becomes this checkout's ``Builder.fingerprint`` of its family) when a change moved template code without
changing the compiled kernels -- prove that first (build the same kernels before and after and compare the code).
It checks that every decision's ``space`` is the fingerprint of commit ``--measured-at`` (the decisions were current
there) and appends ``--provenance`` to the table's provenance, naming that commit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fingerprints(families, tree: str = REPO) -> dict:
    """``Builder.fingerprint`` of each family for the source tree ``tree`` (a fresh interpreter: nothing cached)."""
    code = ("import json, sys; from fmha_dsl.first_use import Builder; b = Builder(); "
            "print(json.dumps({f: b.fingerprint(f) for f in sys.argv[1:]}))")
    out = subprocess.run([sys.executable, "-c", code, *families], cwd=tree, env=dict(os.environ, PYTHONPATH=tree),
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def family(key: str) -> str:
    """The family a decision key is for (its first field)."""
    return key.split(".")[0]


def add_provenance(doc: dict, sentence: str) -> None:
    """Append ``sentence`` to ``doc``'s provenance as a sentence of its own."""
    end = "" if doc["provenance"].rstrip().endswith(".") else "."
    doc["provenance"] += f"{end} {sentence}"


def restamp(path: str, rev: str, text: str) -> dict:
    """The table at ``path`` with its decisions' ``space`` moved from commit ``rev``'s fingerprints to this
    checkout's, ``text`` appended to its provenance; refuses decisions that were not current at ``rev``."""
    with open(path) as f:
        doc = json.load(f)
    fams = sorted({family(k) for k in doc["decisions"]})
    sha = subprocess.run(["git", "-C", REPO, "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True,
                         text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tree:
        subprocess.run(f"git -C '{REPO}' archive {sha} | tar -x -C '{tree}'", shell=True, check=True)
        old = fingerprints(fams, tree)
    new = fingerprints(fams)
    stale = sorted(k for k, r in doc["decisions"].items() if r.get("space") != old[family(k)])
    if stale:
        raise SystemExit(f"{len(stale)} decisions were not measured under the candidate space of {sha[:12]} "
                         f"(e.g. {stale[0]}): measure them again instead")
    for k, r in doc["decisions"].items():
        r["space"] = new[family(k)]
    moved = ", ".join(f"{f} {old[f]} -> {new[f]}" for f in fams)
    add_provenance(doc, f"Carried over on {time.strftime('%Y-%m-%d')} from the candidate space of commit {sha} "
                        f"({moved}) without measuring: {text}")
    return doc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("measured", nargs="*")
    ap.add_argument("--family", default=None, help="replace only this family's decisions of --into")
    ap.add_argument("--into", default="fmha_dsl/data/tuned/sm90_nvidia-h200.json")
    ap.add_argument("--keys-of", default=None)
    ap.add_argument("--min-timed", type=int, default=5)
    ap.add_argument("--provenance", required=True)
    ap.add_argument("--torch", default="2.11.0+cu130")
    ap.add_argument("--triton", default="3.6.0")
    ap.add_argument("--merge", action="store_true",
                    help="with --family: replace only the measured keys, keep the family's other decisions")
    ap.add_argument("--restamp", action="store_true", help="carry --into's decisions over to the current fingerprints")
    ap.add_argument("--measured-at", default=None, help="with --restamp: the commit the decisions are current at")
    args = ap.parse_args()
    from fmha_dsl.atomic_file import write_atomic

    if args.restamp:
        if args.measured or not args.measured_at:
            ap.error("--restamp takes --measured-at REV and no measured table")
        doc = restamp(args.into, args.measured_at, args.provenance)
        write_atomic(args.into, json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"re-stamped {args.into}: {len(doc['decisions'])} decisions")
        return
    if not args.measured:
        ap.error("a measured table is needed (or --restamp)")
    if args.merge and not args.family:
        ap.error("--merge replaces the measured keys of one family: give --family")
    dec = {}
    for path in args.measured:
        with open(path) as f:
            got = json.load(f)
        dec.update(got["decisions"])
    if args.family:
        dec = {k: v for k, v in dec.items() if family(k) == args.family}
    short = sorted(k for k, v in dec.items() if len(v.get("times_us", {})) < args.min_timed)
    if short:
        print(f"{len(short)} measured decisions timed fewer than {args.min_timed} candidates are left out, "
              f"e.g. {short[0]}")
    dec = {k: v for k, v in sorted(dec.items()) if k not in short}
    if args.keys_of:
        with open(args.keys_of) as f:
            want = {k for k in json.load(f)["decisions"] if not args.family or family(k) == args.family}
        dec = {k: v for k, v in dec.items() if k in want}
        missing = sorted(want - set(dec))
        if missing:
            print(f"{len(missing)} keys of {args.keys_of} were not measured, e.g. {missing[0]}")
    if args.family:
        if not dec:  # replacing a family by nothing would drop its shipped decisions
            ap.error(f"no {args.family} decisions timed over >= {args.min_timed} candidates in {args.measured}")
        with open(args.into) as f:
            doc = json.load(f)
        kept = {k: v for k, v in doc["decisions"].items() if family(k) != args.family or (args.merge and k not in dec)}
        doc["decisions"] = dict(sorted({**kept, **dec}.items()))
        add_provenance(doc, f"{time.strftime('%Y-%m-%d')}, {args.family} decisions measured again: {args.provenance}")
        doc["date"] = time.strftime("%Y-%m-%d")
        write_atomic(args.into, json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"wrote {args.into}: {len(dec)} {args.family} decisions replaced, {len(kept)} others kept")
        return
    doc = {"arch": got["arch"], "date": time.strftime("%Y-%m-%d"), "device": got["device"],
           "provenance": args.provenance, "torch": args.torch, "triton": args.triton, "version": got["version"],
           "decisions": dec}
    write_atomic(args.into, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.into}: {len(dec)} decisions")


if __name__ == "__main__":
    main()
