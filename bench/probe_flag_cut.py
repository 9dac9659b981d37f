"""How much first use's cut costs on classes its ranking was not fitted on (fp32, bias, ALiBi, dropout, soft-cap,
sinks), on the device.

    FMHA_DSL_TUNED_SHIPPED=0 python3 -P bench/probe_flag_cut.py [--quick] [--only forward|steps|paged]
                                                                [--select TEXT] [--json PATH]

The cost model's forward ranking was fitted on the shipped tables' classes (fp16 and bf16, no bias, dropout, soft-cap
or sinks), and first use times its first 12 on a wgmma target (``fmha_dsl.first_use``).  Here each class below is
called through ``fmha_dsl.attention`` (a training step: then ``.backward()``, a forward and a backward decision) with
every candidate the rules allow timed (``FMHA_DSL_TUNE_CANDIDATES`` = 100, a fresh cache: first use's own race on
the call's tensors), and each decision is compared with first use's default cut (24, halved where the ranking was
fitted): the winner's position in the cost model's order, and the regret had only the cut been timed (the fastest
time among the cut's candidates over the fastest of all, as in ``bench/probe_candidate_order.py``; a candidate the
race pruned has no time and is left out).  The paged classes call ``fmha_dsl.paged_attention`` the same way (each
of their decisions is reported: a paged kernel's, and for a prefill the gathered route's forward).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# (name, dtype, head dim, seqlen, keywords): 16 heads, 16k tokens, as bench_fwd's matrix
CLASSES = [
    ("fp32 d64", "fp32", 64, 1024, {}),
    ("fp32 d128 causal", "fp32", 128, 4096, {"causal": True}),
    ("bf16 d128 alibi causal", "bf16", 128, 4096, {"causal": True, "alibi": True}),
    ("bf16 d128 bias", "bf16", 128, 2048, {"bias": True}),
    ("bf16 d128 dropout", "bf16", 128, 4096, {"dropout_p": 0.1, "seed": 7}),
    ("bf16 d128 softcap causal", "bf16", 128, 4096, {"causal": True, "softcap": 30.0}),
    ("bf16 d128 window+sink", "bf16", 128, 4096, {"causal": True, "window": (512, 0), "sink": 4}),
    ("fp16 d64 softcap", "fp16", 64, 2048, {"softcap": 50.0}),
    ("bf16 d256 alibi", "bf16", 256, 2048, {"alibi": True}),
]
# training steps (8k tokens): the forward with the LSE and the backward, each a decision of its own
STEPS = [
    ("fp32 d64 step", "fp32", 64, 1024, {}),
    ("fp32 d128 causal step", "fp32", 128, 1024, {"causal": True}),
    ("bf16 d128 alibi causal step", "bf16", 128, 4096, {"causal": True, "alibi": True}),
    ("bf16 d128 window+sink step", "bf16", 128, 4096, {"causal": True, "window": (512, 0), "sink": 4}),
]
# serving, through fmha_dsl.paged_attention over a cache of 16-token pages scattered at random (bench_serving.py's):
# decode (one query row per sequence, 16 sequences) and a prefill (one sequence); GQA 32/8
PAGED = [
    ("fp32 paged decode", "fp32", 128, 8192, {"decode": True}),
    ("fp32 paged prefill causal", "fp32", 128, 4096, {"causal": True}),
    ("bf16 paged decode", "bf16", 128, 8192, {"decode": True}),
]
EXHAUSTIVE = 100   # more than any class has (the backward times half of it)


def _row(name: str, p, arch: str, aligned: bool, disp, candidates) -> dict:
    """One decision's record: every candidate's time, the winner's position in the cost model's order, and the regret
    of first use's default cut (and of the order's first 16 and 24)."""
    from fmha_dsl.first_use import Builder
    from fmha_dsl.runtime import autotune, decisions

    times = disp.measured.get(decisions.key(p, aligned), {})
    os.environ["FMHA_DSL_TUNE_CANDIDATES"] = "24"   # first use's default cut
    cut = [e.name for e in candidates(Builder(), p, arch, aligned)]
    os.environ["FMHA_DSL_TUNE_CANDIDATES"] = str(EXHAUSTIVE)
    order = [e.name for e in candidates(Builder(), p, arch, aligned, autotune.ALL_CANDIDATES)]
    best = min(times, key=times.get) if times else None
    row = {"class": name, "key": decisions.key(p, aligned), "problem": p.model_dump(mode="json", exclude_defaults=True),
           "arch": arch, "aligned": aligned, "candidates": len(order), "timed": len(times), "cut": len(cut),
           "winner": best, "winner_position": order.index(best) if best in order else None, "times_us": times}
    for n, names in (("cut", cut), ("first16", order[:16]), ("first24", order[:24])):
        got = [times[x] for x in names if x in times]
        row[f"regret_{n}"] = min(got) / times[best] - 1 if got and best else None
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the first three classes only")
    ap.add_argument("--only", choices=("forward", "steps", "paged"), default=None,
                    help="only the forward classes, the training steps or the paged (serving) classes")
    ap.add_argument("--select", default="", help="only the classes whose names contain this text (e.g. fp32)")
    ap.add_argument("--json", default=None, help="write the records and regrets here")
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_serving import check_json

    check_json(ap, args.json)
    groups = (("forward", CLASSES, False), ("steps", STEPS, True), ("paged", PAGED, "paged"))
    todo = [(c, kind) for group, classes, kind in groups if args.only in (None, group) for c in classes]
    todo = [(c, kind) for c, kind in todo if args.select in c[0]][:3 if args.quick else None]
    if not todo:
        ap.error(f"--select: no class{' of --only ' + args.only if args.only else ''} has {args.select!r} in its name; "
                 f"the classes: {', '.join(c[0] for c in CLASSES + STEPS + PAGED)}")
    if os.environ.get("FMHA_DSL_TUNED_SHIPPED", "1") != "0":
        ap.error("run with FMHA_DSL_TUNED_SHIPPED=0 (a shipped decision would be used instead of measured)")
    import shutil
    import tempfile

    # a cache of its own: a decision recorded by an earlier run (its fingerprint ignores the candidate count) would be
    # used as it is, and nothing measured
    os.environ["FMHA_DSL_CACHE_DIR"] = cache = tempfile.mkdtemp(prefix="probe_flag_cut_")
    try:
        _probe(args, todo)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _probe(args, todo: list) -> None:
    import torch

    import fmha_dsl
    from fmha_dsl.api_dispatch import dispatcher
    from fmha_dsl.first_use import Builder

    os.environ["FMHA_DSL_TUNE_CANDIDATES"] = str(EXHAUSTIVE)
    seen: list = []
    real = Builder.candidates

    def noting(self, problem, arch, aligned=True, limit=None):  # the problems first use ranks, each once (a training
        if limit is None and (problem, arch, aligned) not in seen:  # forward names its backward's ahead of it)
            seen.append((problem, arch, aligned))
        return real(self, problem, arch, aligned, limit)

    Builder.candidates = noting
    rows = []
    for (name, dtype, d, s, kw), step in todo:
        dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        seen.clear()
        if step == "paged":
            out = q = k = v = None
            _paged_call(fmha_dsl, torch, dt, d, s, **kw)
            kw = None
        else:
            b, h = max(1, (8192 if step else 16384) // s), 16
            q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dt, requires_grad=step) for _ in range(3))
            kw = dict(kw)
            if kw.pop("alibi", False):
                kw["alibi_slopes"] = torch.tensor([2.0 ** (-8 * (i + 1) / h) for i in range(h)], device="cuda")
            if kw.pop("bias", False):
                kw["bias"] = torch.randn(1, h, s, s, device="cuda", dtype=dt)
            out = fmha_dsl.attention(q, k, v, **kw)
            if step:
                out.backward(torch.randn_like(out))
        torch.cuda.synchronize()
        disp = dispatcher(None, torch.cuda.current_device())
        for p, arch, aligned in seen:
            rows.append(_row(name, p, arch, aligned, disp, real))
            r = rows[-1]
            regret = "-" if r["regret_cut"] is None else f"{100 * r['regret_cut']:.2f} %"
            print(f"{name:28s} {p.family:13s} {r['candidates']:3d} candidates, {r['timed']:3d} timed; winner at "
                  f"{r['winner_position']}; cut of {r['cut']}: regret {regret}", flush=True)
        del q, k, v, kw, out
        torch.cuda.empty_cache()
        if args.json:  # after each class: a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "triton": __import__("triton").__version__, "rows": rows}, f, indent=1)


def _paged_call(fmha_dsl, torch, dt, d: int, s: int, decode: bool = False, causal: bool = False) -> None:
    """One ``paged_attention`` call of a :data:`PAGED` class: GQA 32/8, 16-token pages scattered at random; decode:
    16 sequences of ``s`` cached keys and one query row each; else one sequence of ``s`` queries and keys."""
    from bench_serving import paged_copy   # (main put bench/ on the path)

    b, sq, hq, hk = (16, 1, 32, 8) if decode else (1, s, 32, 8)
    k, v = (torch.randn(b, hk, s, d, device="cuda", dtype=dt) for _ in range(2))
    kc, vc, bt, _, _ = paged_copy(k, v, 16)
    q = torch.randn(b * sq, hq, d, device="cuda", dtype=dt)
    cu = torch.arange(b + 1, dtype=torch.int32, device="cuda") * sq
    lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
    fmha_dsl.paged_attention(q, kc, vc, block_table=bt, seqlens_k=lens, cu_seqlens_q=cu, max_seqlen_q=sq,
                             max_seqlen_k=s, causal=causal)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
