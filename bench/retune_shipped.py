"""Measure again every decision of a shipped first-use table (after a template or candidate-space change made them
stale), on the device it is for, through the public API.

    FMHA_DSL_TUNED_SHIPPED=0 python bench/retune_shipped.py [--table fmha_dsl/data/tuned/sm90_nvidia-h200.json]
                                                            [--family fwd|bwd_dq_dk_dv] [--with-candidate TEXT]
                                                            [--key-regex RE] [--min-us US] [--out DIR]

Each decision key (:func:`fmha_dsl.runtime.decisions.key`) names a problem class: dtype, mode, flags, head dims, mask,
GQA octave, and the octaves of seqlen_q, seqlen_k and batch x heads (with whether the lengths are multiples of 128).
For each, a representative problem of that class -- checked to map to the same key; a batch-mode length off the
tile stands for its octave by the octave's top, 2^o - 1, whose calls are the octave's longest -- is called the way a
user calls it: ``fmha_dsl.attention`` (with ``return_lse`` for lse keys), and for backward keys a forward with tensors
that require grad, then ``backward``.  First-use selection measures every candidate on it and records the decision in
the cache (``FMHA_DSL_CACHE_DIR``); ``--out`` gets a copy of the recorded table.  bench/install_tuned.py then keeps the
decisions timed over the full candidate list and writes the shipped file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import time


def problem_of(key: str) -> dict | None:
    """The representative call of a decision key: shapes and keywords (None for keys this script cannot rebuild)."""
    p = key.split(".")
    fam, dtype, mode, vlayout, bias, lse, dropout, logits, sink = p[:9]
    rest = p[9:]
    det = False
    if fam == "bwd_dq_dk_dv":
        if rest[0] != "ndbias":
            return None
        det = rest[1] == "det"
        rest = rest[2:]
    if vlayout != "r" or bias != "no" or dropout != "false" or logits != "false" or sink != "false":
        return None
    if len(rest) != 7:  # a window's class (its octave after the GQA group's): not one of the shipped shapes
        return None
    dims, mask, al, g, q, k, bh = rest
    dq, dv = (int(x) for x in dims[1:].split("x"))
    if al != "a":
        return None
    group = 1 << (int(g[1:]) - 1) if int(g[1:]) else 1

    def length(tok):
        o = int(tok[1:].rstrip("a"))
        n = 1 << (o - 1) if o else 0
        if tok.endswith("a"):
            return n if n % 128 == 0 else None
        if n >= 128 and n % 128 == 0 and mode == "batch":
            n = 2 * n - 1  # the octave's top, not a multiple of 128: its longest calls, where a choice costs most
        return n
    sq, sk = length(q), length(k)
    if sq is None or sk is None:
        return None
    nbh = 1 << (int(bh[2:]) - 1)
    hq = min(nbh, max(16, group))
    if hq % group or nbh % hq:
        return None
    return {"family": fam, "dtype": dtype, "mode": mode, "batch": nbh // hq, "hq": hq, "hk": hq // group, "sq": sq,
            "sk": sk, "dq": dq, "dv": dv, "causal": mask == "mask", "lse": lse == "true", "deterministic": det}


def call(c) -> None:
    import torch

    import fmha_dsl

    dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[c["dtype"]]
    b, hq, hk, sq, sk = c["batch"], c["hq"], c["hk"], c["sq"], c["sk"]
    grad = c["family"] == "bwd_dq_dk_dv"
    if c["mode"] == "group":
        shapes = ((b * sq, hq, c["dq"]), (b * sk, hk, c["dq"]), (b * sk, hk, c["dv"]))
        kw = {"cu_seqlens_q": torch.arange(b + 1, device="cuda", dtype=torch.int32) * sq,
              "cu_seqlens_k": torch.arange(b + 1, device="cuda", dtype=torch.int32) * sk,
              "max_seqlen_q": sq, "max_seqlen_k": sk}
    else:
        shapes = ((b, hq, sq, c["dq"]), (b, hk, sk, c["dq"]), (b, hk, sk, c["dv"]))
        kw = {}
    q, k, v = (torch.randn(s, device="cuda", dtype=dt, requires_grad=grad and not c["deterministic"])
               for s in shapes)
    if c["deterministic"]:  # as a user asks for it: the explicit backward
        out, lse = fmha_dsl.attention(q, k, v, causal=c["causal"], return_lse=True, **kw)
        fmha_dsl.attention_backward(q, k, v, out, lse, torch.randn_like(out), causal=c["causal"], deterministic=True,
                                    **kw)
    else:
        res = fmha_dsl.attention(q, k, v, causal=c["causal"], return_lse=c["lse"] and not grad, **kw)
        out = res[0] if isinstance(res, tuple) else res
        if grad:
            out.backward(torch.randn_like(out))
    torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", default=os.path.join(os.path.dirname(__file__), "..", "fmha_dsl", "data", "tuned",
                                                    "sm90_nvidia-h200.json"))
    ap.add_argument("--family", default=None, help="only this family's keys (fwd or bwd_dq_dk_dv)")
    ap.add_argument("--with-candidate", default=None,
                    help="only the keys whose recorded timings name a candidate containing this text (e.g. splitkv: "
                         "the decisions a change to the split-KV combine can move)")
    ap.add_argument("--key-regex", default=None,
                    help="only the keys this regular expression finds (re.search); e.g. '\\.q1[0-5]\\.': query lengths "
                         "of 512 and more off the tile")
    ap.add_argument("--min-us", type=float, default=None,
                    help="only the keys whose recorded fastest time is at least this many microseconds (e.g. 100: the "
                         "decisions first use times sustained)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if os.environ.get("FMHA_DSL_TUNED_SHIPPED", "1") != "0":
        raise SystemExit("set FMHA_DSL_TUNED_SHIPPED=0: the shipped decisions must be measured, not read")
    from fmha_dsl.keys import Problem
    from fmha_dsl.runtime import decisions

    table = json.load(open(args.table))["decisions"]
    keys = sorted(table)
    if args.family:
        keys = [k for k in keys if k.split(".")[0] == args.family]
    if args.with_candidate:
        keys = [k for k in keys if any(args.with_candidate in name for name in table[k].get("times_us", {}))]
    if args.key_regex:
        keys = [k for k in keys if re.search(args.key_regex, k)]
    if args.min_us is not None:
        keys = [k for k in keys if min(table[k].get("times_us", {}).values() or [0.0]) >= args.min_us]
    done = skipped = 0
    t0 = time.time()
    for key in keys:
        c = problem_of(key)
        if c is None:
            print(f"skip (not rebuildable): {key}", flush=True)
            skipped += 1
            continue
        fam = c["family"]
        mask = "top_left" if c["causal"] else "no"
        p = Problem(family=fam, dtype=c["dtype"], batch=c["batch"], nhead_q=c["hq"], nhead_k=c["hk"], seqlen_q=c["sq"],
                    seqlen_k=c["sk"], max_seqlen_q=c["sq"], max_seqlen_k=c["sk"], hdim_q=c["dq"], hdim_v=c["dv"],
                    mode=c["mode"], mask=mask, lse=c["lse"] and fam == "fwd", deterministic=c["deterministic"])
        if decisions.key(p) != key:
            print(f"skip (representative maps to {decisions.key(p)}): {key}", flush=True)
            skipped += 1
            continue
        call(c)
        done += 1
        print(f"[{done}/{len(keys)}] {time.time() - t0:6.0f} s  {key}", flush=True)
    print(f"measured {done}, skipped {skipped}")
    if args.out:
        from fmha_dsl.cache import cache_base

        os.makedirs(args.out, exist_ok=True)
        for name in os.listdir(os.path.join(cache_base(), "tuned")):
            shutil.copy(os.path.join(cache_base(), "tuned", name), args.out)


if __name__ == "__main__":
    main()
