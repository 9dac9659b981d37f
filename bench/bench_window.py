"""Sliding-window attention as a user calls it: ``fmha_dsl.attention`` and ``fmha_dsl.paged_attention`` with a
``window`` (Mistral's 4,096 keys, the local layers of Gemma's 1,024), default arguments, next to the peers.

    python bench/bench_window.py [--parts decode,prefill,train] [--quick] [--sinks] [--ours-only] [--json OUT.json]

* decode: one query token per sequence (``causal="bottom_right", window=(W - 1, 0)``: the last W keys), GQA 32/8,
  d128, bf16, batch 1/8/32, contexts 8k-128k, W = 1024 and 4096: contiguous K/V through ``attention`` and the same
  K/V in pages of 16 scattered at random through ``paged_attention``.  Effective bandwidth = the K and V bytes in
  the window / time, next to the device's copy bandwidth (read + write) and the same call's bounds: FA2/cuDNN-SDPA
  and ``attention`` on the window's keys alone (``k[:, :, -W:]`` contiguous: as if nothing else were cached), and
  FlexAttention with a sliding-window block mask on the whole cache.  With ``--sinks`` also each shape with 4 sink
  tokens (StreamingLLM's): the bounds then run on the sink keys and the window's, concatenated.
* prefill: bf16 d128, 16 heads, 16k tokens, S = 4096 and 16384, causal windows of 512 and 4096 keys: TFLOP/s
  counting the (query, key) pairs the window leaves visible, next to FlexAttention (a sliding-window block mask)
  and to the same call without the window (its own FLOPs: a causal mask's).
* train: the same shapes' backward (``torch.autograd.grad`` of ``attention``'s output, as bench_bwd.py times it;
  FLOPs 2.5x the forward's), next to FlexAttention's backward; the gradients checked against SDPA's efficient
  backend with the mask spelled out.

Every output is checked before it is timed: decode against the bound's (SDPA on the keys in reach), prefill against
SDPA's efficient backend with the window's mask spelled out (a boolean ``attn_mask``).  Timing:
bench_serving.py's (CUDA events, median, the L2 flushed by a read before each call).  FLOPs = 4 * D per visible
(query, key) pair and head.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

WINDOWS = (1024, 4096)
DECODE = [(1, 8192), (1, 32768), (1, 131072), (8, 32768), (8, 131072), (32, 32768)]
PREFILL = [(4096, 512), (4096, 4096), (16384, 512), (16384, 4096)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="decode,prefill,train", help="decode, prefill, train (comma-separated)")
    ap.add_argument("--quick", action="store_true", help="a few shapes of each part")
    ap.add_argument("--sinks", action="store_true", help="decode: also each shape with 4 sink tokens")
    ap.add_argument("--ours-only", action="store_true", help="no peers or bounds (e.g. to compare two versions)")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    parts = args.parts.split(",")
    if not parts or set(parts) - {"decode", "prefill", "train"}:
        ap.error(f"--parts takes decode, prefill and train, comma-separated, got {args.parts!r}")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_serving import check_json, copy_bandwidth, device_doc

    check_json(ap, args.json)
    doc = dict(device_doc(ap), bytes="K + V bytes in the window", flops="4 * D per visible (query, key) pair and head",
               copy_gbps=copy_bandwidth(), parts={})
    print(f"{doc['device']}: copy {doc['copy_gbps']:.0f} GB/s (read + write)", flush=True)

    def save():
        if args.json:
            from fmha_dsl.atomic_file import write_atomic

            write_atomic(args.json, json.dumps(doc, indent=1))

    for part in parts:
        doc["parts"][part] = {"decode": decode, "prefill": prefill, "train": train}[part](args, doc["copy_gbps"])
        save()


def _flex(mask_mod, q, k, v):
    """``run()``: FlexAttention on ``q``, ``k``, ``v`` with ``mask_mod``'s block mask (compiled afresh)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.reset()  # a fresh compile: a graph compiled for another window (mask_mod) must not be reused
    flex = torch.compile(flex_attention, dynamic=False)
    bm = create_block_mask(mask_mod, None, None, q.shape[2], k.shape[2])
    return lambda: flex(q, k, v, block_mask=bm, enable_gqa=q.shape[1] != k.shape[1])


def _peer(row, name, make, *a, **kw):
    """Time a peer whose set-up may fail (FlexAttention's compile): the error is the row's entry."""
    from bench_serving import _timed

    try:
        run = make()
    except Exception as exc:  # a peer's failure is a figure of the run, not the end of it
        row[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:140]}" if str(exc) else
                     type(exc).__name__}
        return
    _timed(row, name, run, *a, **kw)


def decode(args, copy: float) -> list:
    import torch

    import fmha_dsl
    from bench_serving import _sdpa, _timed, _timed_paged, paged_copy

    hk, ratio, d = 8, 4, 128
    shapes = [DECODE[1], DECODE[3]] if args.quick else DECODE
    rows = []
    for b, sk in shapes:
        torch.manual_seed(0)
        q = torch.randn(b, hk * ratio, 1, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hk, sk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        kc, vc, bt, _, _ = paged_copy(k, v, 16)
        q3 = q[:, :, 0].contiguous()
        cq = torch.arange(b + 1, dtype=torch.int32, device="cuda")
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        for w in WINDOWS:
            for sink in ((0, 4) if args.sinks else (0,)):
                keys = slice(sk - w, sk)
                kw_, vw = k[:, :, keys].contiguous(), v[:, :, keys].contiguous()
                if sink:  # the sink keys and the window's: softmax over their union, in any order
                    kw_, vw = torch.cat([k[:, :, :sink], kw_], 2), torch.cat([v[:, :, :sink], vw], 2)
                nbytes = 2 * b * hk * kw_.shape[2] * d * 2
                row = {"batch": b, "seqlen_k": sk, "window": w, "sink": sink, "gqa": ratio, "kv_bytes": nbytes,
                       "copy_gbps": copy}
                ref = _sdpa(q, kw_, vw, False, "flash")()
                win = dict(causal="bottom_right", window=(w - 1, 0), sink=sink or None)
                _timed(row, "attention", lambda: fmha_dsl.attention(q, k, v, **win), ref, nbytes=nbytes)
                _timed_paged(row, "paged", q3, lambda: fmha_dsl.paged_attention(
                    q3, kc, vc, block_table=bt, seqlens_k=lens, cu_seqlens_q=cq, max_seqlen_q=1, max_seqlen_k=sk,
                    **win), ref, nbytes=nbytes, to_bhsd=lambda o: o[:, :, None])
                for name in () if args.ours_only else ("flash", "cudnn"):
                    _timed(row, f"bound_sdpa_{name}", _sdpa(q, kw_, vw, False, name), ref, nbytes=nbytes)
                if not args.ours_only:
                    _timed(row, "bound_attention", lambda: fmha_dsl.attention(q, kw_, vw), ref, nbytes=nbytes)
                if not sink and not args.ours_only:
                    off = sk - 1

                    def sliding(b_, h, i, j, off=off, w=w):
                        return (i + off >= j) & (i + off - j < w)
                    _peer(row, "flex", lambda: _flex(sliding, q, k, v), ref,
                          nbytes=nbytes)
                rows.append(row)

                def g(n):
                    return (row.get(n) or {}).get("gbps", 0)
                print(f"decode b{b:>2} sk{sk:>6} W{w:>5}{' +4 sinks' if sink else ''}: attention={g('attention'):5.0f} "
                      f"paged={g('paged'):5.0f} GB/s ({g('paged') / copy:.0%} of copy)  bounds: "
                      f"fa2={g('bound_sdpa_flash'):5.0f} cudnn={g('bound_sdpa_cudnn'):5.0f} "
                      f"attention={g('bound_attention'):5.0f}  flex={g('flex'):5.0f}", flush=True)
                kw_ = vw = ref = None   # (freed before the next window's)
        q = k = v = kc = vc = bt = q3 = None
        torch.cuda.empty_cache()
    return rows


def _pairs(s: int, w: int) -> int:
    """(query, key) pairs a causal window of ``w`` keys leaves visible in an ``s`` x ``s`` problem."""
    near = min(w, s)
    return near * (near + 1) // 2 + (s - near) * w


def _prefill_shapes(args, tensors: int):
    """bench_fwd's matrix's lengths with each window: ``(s, w, row, tensors, visible, sliding)`` -- the row's
    fields, ``tensors`` random bf16 ``[B, 16, S, 128]`` tensors (16k tokens), the visible pairs as a boolean mask
    and as FlexAttention's mask_mod."""
    import torch

    h, d = 16, 128
    for s, w in PREFILL[:2] if args.quick else PREFILL:
        b = max(1, 16384 // s)
        torch.manual_seed(0)
        ts = [torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(tensors)]
        i = torch.arange(s, device="cuda")
        visible = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < w)

        def sliding(b_, h_, j, n, w=w):
            return (j >= n) & (j - n < w)
        row = {"batch": b, "heads": h, "seqlen": s, "window": w, "flops": 4 * d * _pairs(s, w) * b * h}
        yield s, w, row, ts, visible, sliding
        ts = visible = i = None
        torch.cuda.empty_cache()


def prefill(args, copy: float) -> list:
    import fmha_dsl
    from bench_serving import _sdpa, _timed

    rows = []
    for s, w, row, (q, k, v), visible, sliding in _prefill_shapes(args, 3):
        flops = row["flops"]
        ref = _sdpa(q, k, v, False, "efficient", mask=visible)()   # the truth: SDPA with the mask spelled out
        _timed(row, "attention", lambda: fmha_dsl.attention(q, k, v, causal=True, window=(w - 1, 0)), ref, f=flops)
        if not args.ours_only:
            _peer(row, "flex", lambda: _flex(sliding, q, k, v), ref, f=flops)
            _timed(row, "attention_causal", lambda: fmha_dsl.attention(q, k, v, causal=True),
                   f=2 * q.shape[3] * s * s * q.shape[0] * q.shape[1])
        rows.append(row)

        def t(n):
            return (row.get(n) or {}).get("tflops", 0)
        print(f"prefill S{s:>6} W{w:>5}: attention={t('attention'):5.0f} flex={t('flex'):5.0f} TFLOP/s  "
              f"(causal, no window: {t('attention_causal'):.0f})", flush=True)
        q = k = v = ref = None
    return rows


def train(args, copy: float) -> list:
    import fmha_dsl
    from bench_serving import _bench, _sdpa

    rows = []
    for s, w, row, (q, k, v, do), visible, sliding in _prefill_shapes(args, 4):
        row["flops"] = flops = 2.5 * row["flops"]
        want = _grads(lambda q, k, v: _sdpa(q, k, v, False, "efficient", mask=visible)(), q, k, v, do)()
        ways = {"attention": lambda q, k, v: fmha_dsl.attention(q, k, v, causal=True, window=(w - 1, 0))}
        if not args.ours_only:
            ways["flex"] = lambda q, k, v: _flex(sliding, q, k, v)()
        for name, forward in ways.items():
            try:
                run = _grads(forward, q, k, v, do)
                err = max(((g.float() - x.float()).norm() / x.float().norm()).item() for g, x in zip(run(), want))
                row[name] = {"error": f"wrong gradients (rel err {err:.3g})"} if not err <= 2e-2 else {
                    "ms": _bench(run), "rel_err": err}
                if "ms" in row[name]:
                    row[name]["tflops"] = flops / row[name]["ms"] / 1e9
            except Exception as exc:  # a peer's failure is a figure of the run, not the end of it
                row[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:140]}"}
        rows.append(row)

        def t(n):
            return (row.get(n) or {}).get("tflops", 0)
        print(f"backward S{s:>6} W{w:>5}: attention={t('attention'):5.0f} flex={t('flex'):5.0f} TFLOP/s", flush=True)
        q = k = v = do = want = None
    return rows


def _grads(forward, q, k, v, do):
    """``run()`` -> the gradients of ``forward(q, k, v)`` for ``do``, over one recorded graph (bench_bwd.py's)."""
    import torch

    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = forward(q, k, v)
    return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)


if __name__ == "__main__":
    main()
