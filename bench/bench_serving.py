"""The serving API as a server calls it: ``fmha_dsl.paged_attention`` (and ``append_kv``) with default arguments (no
registry: first-use selection), next to the peers on the same data made contiguous.

    python bench/bench_serving.py [--parts decode,prefill,overhead] [--quick] [--json OUT.json]

* decode: Sq = 1, batch 1..128, GQA 8:1 and 4:1 (8 K/V heads), d128, bf16, context 1k..128k, page sizes 1, 16 and
  1024, pages scattered over the cache at random (at page 16 also CK's vectorized layout of the same pages).
  Effective bandwidth = K and V bytes read / time, next to the device's copy bandwidth (bytes read + written,
  measured here), FA2-SDPA and cuDNN-SDPA on the same K/V contiguous ``[B, Hk, Sk, D]`` (enable_gqa: the unpaged
  bound) and ``fmha_dsl.attention`` on it.
* prefill: seed 003's shapes (batch 1, h = Hq/Hk = 6/1, 16/1, 40/40, sq = sk 1k..128k, causal or not), bf16 d128,
  page sizes 1, 16, 1024: TFLOP/s next to ``fmha_dsl.attention`` on contiguous varlen K/V (the paged overhead) and
  cuDNN/FA2-SDPA on contiguous K/V.
* chunked: chunked prefill as vLLM/SGLang schedule it -- each sequence's next chunk of C query tokens over its L
  cached tokens (the chunk's own K/V already appended), causal aligned bottom-right; Hq/Hk = 32/8, bf16 d128, pages of
  16 scattered: TFLOP/s next to ``fmha_dsl.attention`` on the same K/V contiguous (group mode, ``causal=
  "bottom_right"``) and SDPA's backends with torch's ``causal_lower_right`` mask (those that take it).  FLOPs count
  the keys each query sees: ``4 * Hq * D * (C * (L - C) + C * (C + 1) / 2)`` per sequence.
* overhead: host time per call of a tiny decode step (the launch-bound case) through ``paged_attention`` (with a
  caller's ``out`` and workspace, and allocating) and ``append_kv`` with ``max_seqlen_*`` given, CPU wall clock per
  call over 5000 calls: on the torch fast path (the extension's C++ replay, waited for) and on the Python replay.

Every output is checked against SDPA's (or, for append-KV, against the rows written) before it is timed.  The calls
pass ``max_seqlen_q``/``max_seqlen_k`` as a server does (no device-to-host copy).  Timing: CUDA events, warm-up,
median, as triton.testing.do_bench times, but the L2 flushed by a read instead of a write (:func:`_flush`).
FLOPs = 4 * Hq * Sq * Sk * D per sequence, halved for causal.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time

PAGES = (1, 16, 1024)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="overhead,decode,prefill,chunked")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    doc = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "python": platform.python_version(),
           "flops": "4*Hq*Sq*Sk*D per sequence, halved for causal", "bytes": "K + V bytes read",
           "timing": "CUDA events, median, L2 flushed by reading 512 MB before each call", "parts": {}}

    def save():
        if args.json:
            from fmha_dsl.atomic_file import write_atomic

            write_atomic(args.json, json.dumps(doc, indent=1))

    for part in args.parts.split(","):
        doc["parts"][part] = {"overhead": overhead, "decode": decode, "prefill": prefill, "chunked": chunked}[part](args)
        save()
    summarize(doc)
    save()


_FLUSH = {}


def _flush():
    """Evict the L2 by reading a 512 MB buffer (into a scalar).  ``do_bench`` zeroes a 256 MB one instead, which
    leaves the L2 full of dirty lines that the timed call's first misses must write back: 3-10 us at decode shapes
    (``bench/probe_flush.py``).  A server's attention follows GEMMs that mostly read (weights), so clean lines are
    what it meets.  The read also takes about twice the zeroing's GPU time, which hides a longer host launch path."""
    import torch

    if not _FLUSH:
        _FLUSH["buf"] = torch.ones(128 << 20, dtype=torch.float32, device="cuda")
        _FLUSH["sink"] = torch.empty((), dtype=torch.float32, device="cuda")
    torch.sum(_FLUSH["buf"], 0, out=_FLUSH["sink"])


def _bench(fn, warmup_ms: float = 25, rep_ms: float = 100, flush=None) -> float:
    """Median ms of ``fn`` over CUDA-event timings of ``rep_ms`` worth of calls after ``warmup_ms`` of them, each
    timed call after ``flush`` (default :func:`_flush`) -- ``triton.testing.do_bench``'s method with a read flush
    instead of a write."""
    import torch

    flush = flush or _flush

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush()
        fn()
    end.record()
    torch.cuda.synchronize()
    each = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / each))):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(max(1, int(rep_ms / each)))]
    for s, e in events:
        flush()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def _sdpa(q, k, v, causal, backend, mask=None):
    """A call of SDPA's ``backend`` (flash, cudnn, efficient) on ``[B, H, S, D]`` tensors, GQA enabled where the heads
    differ; ``mask``: an ``attn_mask`` (torch's ``causal_lower_right``) instead of ``is_causal``."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
          "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]

    def run():
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                  enable_gqa=q.shape[1] != k.shape[1])
    return run


def _timed(row, name, run, ref=None, f=None, nbytes=None, to_bhsd=None):
    try:
        out = run()
        if ref is not None:
            o = to_bhsd(out) if to_bhsd else out
            err = ((o.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()
            if not math.isfinite(err) or err > 2e-2:
                row[name] = {"error": f"wrong result (rel err {err:.3g})"}
                return
        ms = _bench(run)
    except RuntimeError as exc:
        row[name] = {"error": str(exc).splitlines()[0][:160]}
        return
    row[name] = {"ms": ms}
    if f:
        row[name]["tflops"] = f / ms / 1e9
    if nbytes:
        row[name]["gbps"] = nbytes / ms / 1e6


def paged_copy(k, v, page: int, seed: int = 0, scatter: bool = True):
    """``k``/``v [B, Hk, S, D]`` (every sequence S tokens) as caches ``[P, page, Hk, D]`` in pages scattered at
    random (``scatter=False``: in order, each sequence's pages contiguous), with the vLLM table and the SGLang
    indptr/indices of the same pages."""
    import torch

    b, hk, s, d = k.shape
    per = -(-s // page)
    n = b * per
    g = torch.Generator(device="cpu").manual_seed(seed)
    perm = (torch.randperm(n, generator=g) if scatter else torch.arange(n)).to(torch.int32)
    kc = torch.empty(n, page, hk, d, dtype=k.dtype, device=k.device)
    vc = torch.empty_like(kc)
    pad = per * page - s
    for x, c in ((k, kc), (v, vc)):
        src = x.permute(0, 2, 1, 3)                                             # [B, S, Hk, D]
        if pad:
            src = torch.cat([src, src.new_zeros(b, pad, hk, d)], 1)
        c[perm.long().to(k.device)] = src.reshape(n, page, hk, d)
    bt = perm.view(b, per).to(k.device)
    indptr = (torch.arange(b + 1, dtype=torch.int32) * per).to(k.device)
    return kc, vc, bt, indptr, bt.reshape(-1).contiguous()


def check_json(ap, path: str | None) -> None:
    """``ap.error`` unless ``--json``'s ``path`` (None: none asked for) can be written: told before the measuring,
    not after it."""
    folder = os.path.dirname(os.path.abspath(path or ".")) or "."
    if path and not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
        ap.error(f"--json: cannot write {path}")


def device_doc(ap) -> dict:
    """A results document's header (device, date, versions) for a bench that needs a CUDA GPU (``ap.error`` without
    one)."""
    import torch

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (torch.cuda.is_available() is False)")
    return {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "python": platform.python_version()}


def copy_bandwidth() -> float:
    import torch

    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = _bench(lambda: y.copy_(x))
    del x, y
    return 2 * (1 << 30) / ms / 1e6


def _timed_paged(row, name, q, run, ref, **kw) -> None:
    """:func:`_timed` for a ``paged_attention`` call, with the name of the plan that call made: the one it added to
    the default dispatcher's paged plans (every row of this bench is a class of its own; "" if it added none)."""
    import fmha_dsl.api_dispatch as api
    from fmha_dsl.runtime.plan_gather import GatheredPlan

    disp = api.dispatcher(None, q.get_device())   # the default path's (no registry)
    before = set(disp.fast_paged)
    _timed(row, name, run, ref, **kw)
    new = [plan for key, plan in disp.fast_paged.items() if key not in before]
    if "ms" in row[name]:
        row[name]["kernel"] = "" if len(new) != 1 else (
            ("gather+" if isinstance(new[0], GatheredPlan) else "") + new[0].entry.name)  # copy, then forward


def decode(args):
    import torch

    import fmha_dsl
    from fmha_dsl.reference_paged import vectorized_caches

    copy = copy_bandwidth()
    print(f"copy bandwidth (read + write): {copy:.0f} GB/s", flush=True)
    shapes = [(1, 1024), (1, 8192), (1, 32768), (1, 131072), (8, 8192), (8, 32768), (8, 131072), (32, 8192),
              (32, 32768), (128, 1024), (128, 8192)]
    if args.quick:
        shapes = [(1, 32768), (8, 8192), (128, 1024)]
    hk, d = 8, 128
    rows = []
    for ratio in (8, 4):
        for b, sk in shapes:
            hq = hk * ratio
            torch.manual_seed(0)
            q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(b, hk, sk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            nbytes = 2 * b * hk * sk * d * 2
            base = {"gqa": ratio, "batch": b, "seqlen_k": sk, "kv_bytes": nbytes, "copy_gbps": copy}
            ref = _sdpa(q, k, v, False, "flash")()
            peers = {}

            def time_peers(into):
                for name in ("flash", "cudnn"):
                    _timed(into, f"sdpa_{name}", _sdpa(q, k, v, False, name), nbytes=nbytes)
                _timed(into, "attention_contiguous", lambda: fmha_dsl.attention(q, k, v), ref, nbytes=nbytes)
            time_peers(peers)
            first = len(rows)
            q3 = q[:, :, 0].contiguous()                                        # [B, Hq, D]: one token per sequence
            cq = torch.arange(b + 1, dtype=torch.int32, device="cuda")
            lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
            for page in PAGES:
                kc, vc, bt, ip, ix = paged_copy(k, v, page)
                row = dict(base, page_size=page, **peers)
                for form, tab in (("vllm", {"block_table": bt}), ("sglang", {"kv_indptr": ip, "kv_indices": ix})):
                    if form == "sglang" and page != 16:
                        continue  # SGLang's table measured at one page size (its addressing is the same)

                    def run(tab=tab):
                        return fmha_dsl.paged_attention(q3, kc, vc, seqlens_k=lens, cu_seqlens_q=cq, max_seqlen_q=1,
                                                        max_seqlen_k=sk, **tab)
                    _timed_paged(row, f"paged_{form}", q3, run, ref, nbytes=nbytes, to_bhsd=lambda o: o[:, :, None])
                if page == 16:  # CK's vectorized layout, the same pages (vLLM's table)
                    k5, v5 = vectorized_caches(kc, vc)

                    def run_vec():
                        return fmha_dsl.paged_attention(q3, k5, v5, seqlens_k=lens, cu_seqlens_q=cq, max_seqlen_q=1,
                                                        max_seqlen_k=sk, block_table=bt)
                    _timed_paged(row, "paged_vectorized", q3, run_vec, ref, nbytes=nbytes,
                                 to_bhsd=lambda o: o[:, :, None])
                    del k5, v5
                rows.append(row)
                del kc, vc, bt, ip, ix
            # the peers once more, after ours: each keeps the faster of its two timings (one slow timing of a peer
            # -- seen once for both SDPA backends at one shape -- would flatter every page size's ratio)
            again = {}
            time_peers(again)
            for name, t in again.items():
                if "ms" in t and ("ms" not in peers[name] or t["ms"] < peers[name]["ms"]):
                    for row in rows[first:]:
                        row[name] = t
            for row in rows[first:]:
                def g(n):
                    return (row.get(n) or {}).get("gbps", 0)
                print(f"decode gqa{ratio} b{b:>3} sk{sk:>6} page{row['page_size']:>4}: paged={g('paged_vllm'):5.0f} "
                      f"GB/s ({g('paged_vllm') / copy:.0%} of copy)  fa2={g('sdpa_flash'):5.0f} "
                      f"cudnn={g('sdpa_cudnn'):5.0f} attention={g('attention_contiguous'):5.0f}"
                      + (f" vectorized={g('paged_vectorized'):5.0f}" if row["page_size"] == 16 else "")
                      + f"  {row['paged_vllm'].get('kernel', '')[:70]}",
                      flush=True)
            del q, k, v, ref
            torch.cuda.empty_cache()
    return rows


def prefill(args):
    import torch

    import fmha_dsl

    shapes = [(6, 1, 1024, True), (6, 1, 4096, True), (6, 1, 16384, True), (6, 1, 65536, True),
              (6, 1, 131072, True), (16, 1, 65536, True), (40, 40, 37 * 1024, False)]
    if args.quick:
        shapes = [(6, 1, 4096, True), (40, 40, 8192, False)]
    d = 128
    rows = []
    for hq, hk, s, causal in shapes:
        torch.manual_seed(0)
        q = torch.randn(1, hq, s, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, hk, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        f = 4 * hq * s * s * d / (2 if causal else 1)
        base = {"hq": hq, "hk": hk, "seqlen": s, "causal": causal}
        ref = _sdpa(q, k, v, causal, "flash")()
        peers = {}
        for name in ("flash", "cudnn"):
            _timed(peers, f"sdpa_{name}", _sdpa(q, k, v, causal, name), f=f)
        qv = q[0].transpose(0, 1).contiguous()                                 # varlen [T, H, D]
        kv_, vv = (x[0].transpose(0, 1).contiguous() for x in (k, v))
        cu = torch.tensor([0, s], dtype=torch.int32, device="cuda")
        bhsd = (lambda o: o.transpose(0, 1)[None])
        _timed(peers, "attention_varlen", lambda: fmha_dsl.attention(qv, kv_, vv, causal=causal, cu_seqlens_q=cu,
                                                                     cu_seqlens_k=cu, max_seqlen_q=s, max_seqlen_k=s),
               ref, f=f, to_bhsd=bhsd)
        lens = torch.tensor([s], dtype=torch.int32, device="cuda")
        for page in PAGES:
            kc, vc, bt, _, _ = paged_copy(k, v, page)
            row = dict(base, page_size=page, **peers)
            _paged_row(row, f"prefill h{hq}/{hk} s{s:>6} {'c ' if causal else 'nc'} page{page:>4}", qv, ref, f, bhsd,
                       lambda: fmha_dsl.paged_attention(qv, kc, vc, block_table=bt, seqlens_k=lens, cu_seqlens_q=cu,
                                                        max_seqlen_q=s, max_seqlen_k=s, causal=causal))
            rows.append(row)
            del kc, vc, bt
        del q, k, v, ref
        torch.cuda.empty_cache()
    return rows


def _paged_row(row, label: str, qv, ref, f, to_bhsd, run) -> None:
    """Time ``run`` (a paged_attention call) into ``row["paged"]`` with the plan it took, and print the row next to
    ``attention()`` on the contiguous K/V and the SDPA peers."""
    _timed_paged(row, "paged", qv, run, ref, f=f, to_bhsd=to_bhsd)

    def t(n):
        return (row.get(n) or {}).get("tflops", 0)
    print(f"{label}: paged={t('paged'):6.1f} varlen={t('attention_varlen'):6.1f} "
          f"(overhead {1 - t('paged') / max(t('attention_varlen'), 1e-9):+.1%}) fa2={t('sdpa_flash'):6.1f} "
          f"cudnn={t('sdpa_cudnn'):6.1f}  {row['paged'].get('kernel', '')[:60]}", flush=True)


def chunked(args):
    """Chunked prefill: ``B`` sequences, each a chunk of ``C`` new query tokens over ``L`` cached tokens (page 16)."""
    import torch
    from torch.nn.attention.bias import causal_lower_right

    import fmha_dsl

    shapes = [(1, 512, 8192), (1, 2048, 32768), (4, 512, 16384), (8, 256, 8192), (2, 1024, 65536), (16, 128, 4096)]
    if args.quick:
        shapes = [(1, 2048, 32768), (8, 256, 8192)]
    hq, hk, d, page = 32, 8, 128, 16
    rows = []
    for b, c, ln in shapes:
        torch.manual_seed(0)
        q = torch.randn(b, hq, c, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hk, ln, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        f = 4 * hq * d * b * (c * (ln - c) + c * (c + 1) / 2)
        row = {"batch": b, "chunk": c, "context": ln, "hq": hq, "hk": hk, "page_size": page}
        bias = causal_lower_right(c, ln)
        ref = None
        for name in ("flash", "cudnn", "efficient"):
            sdpa = _sdpa(q, k, v, False, name, mask=bias)
            _timed(row, f"sdpa_{name}", sdpa, ref, f=f)   # each backend checked against the first that ran
            if ref is None and "ms" in row[f"sdpa_{name}"]:
                ref = sdpa()
        qv = q.transpose(1, 2).reshape(b * c, hq, d)                             # varlen [T, H, D]
        kv_, vv = (x.transpose(1, 2).reshape(b * ln, hk, d) for x in (k, v))
        cq = torch.arange(b + 1, dtype=torch.int32, device="cuda") * c
        ck = torch.arange(b + 1, dtype=torch.int32, device="cuda") * ln

        def bhsd(o):
            return o.reshape(b, c, hq, -1).transpose(1, 2)
        _timed(row, "attention_varlen", lambda: fmha_dsl.attention(qv, kv_, vv, causal="bottom_right", cu_seqlens_q=cq,
                                                                   cu_seqlens_k=ck, max_seqlen_q=c, max_seqlen_k=ln),
               ref, f=f, to_bhsd=bhsd)
        kc, vc, bt, _, _ = paged_copy(k, v, page)
        lens = torch.full((b,), ln, dtype=torch.int32, device="cuda")
        _paged_row(row, f"chunked b{b} chunk{c:>5} context{ln:>6} page{page}", qv, ref, f, bhsd,
                   lambda: fmha_dsl.paged_attention(qv, kc, vc, block_table=bt, seqlens_k=lens, cu_seqlens_q=cq,
                                                    max_seqlen_q=c, max_seqlen_k=ln, causal=True))
        rows.append(row)
        del q, k, v, kc, vc, bt, ref
        torch.cuda.empty_cache()
    return rows


def overhead(args):
    """Host time per call (the launch-bound case): a decode step of one sequence with a 16-token context."""
    import torch

    import fmha_dsl
    from fmha_dsl.paged import workspace_numel

    q = torch.randn(1, 8, 128, device="cuda", dtype=torch.bfloat16)
    kc, vc = (torch.randn(4, 16, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    bt = torch.tensor([[0, 1]], dtype=torch.int32, device="cuda")
    lens = torch.tensor([15], dtype=torch.int32, device="cuda")
    cq = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    kn, vn = (torch.randn(1, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ws = torch.empty(workspace_numel(q, kc, vc, batch=1, max_seqlen_q=1, max_seqlen_k=32), dtype=torch.float32,
                     device="cuda")
    out = torch.empty_like(q)
    calls = {
        "paged_attention": lambda: fmha_dsl.paged_attention(q, kc, vc, block_table=bt, seqlens_k=lens, cu_seqlens_q=cq,
                                                            max_seqlen_q=1, max_seqlen_k=32, out=out, workspace=ws),
        "paged_attention_allocating": lambda: fmha_dsl.paged_attention(q, kc, vc, block_table=bt, seqlens_k=lens,
                                                                       cu_seqlens_q=cq, max_seqlen_q=1,
                                                                       max_seqlen_k=32),
        "append_kv": lambda: fmha_dsl.append_kv(kc, vc, kn, vn, block_table=bt, seqlens_k=lens, cu_seqlens_new=cq,
                                                max_seqlen_new=1),
    }
    from fmha_dsl import replay
    from fmha_dsl.runtime import torch_fast

    calls["paged_attention"]()
    ready = torch_fast.wait(600)  # the torch fast path's extension (its Replayer), built in the background
    res = {"extension_ready": ready}
    for path in ("torch_fast", "python_replay"):
        if path == "python_replay":  # the extension out of the way: what a process without it gets
            replay._STATE["loaded"] = lambda: None
            replay._STATE.pop("replayer", None)
        for name, fn in calls.items():
            for _ in range(50):
                fn()
            torch.cuda.synchronize()
            n = 5000
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            host = (time.perf_counter() - t0) / n * 1e6
            torch.cuda.synchronize()
            res.setdefault(name, {})[path] = round(host, 2)
            print(f"overhead {name} [{path}]: {host:.1f} us per call (host)", flush=True)
    replay._STATE["loaded"] = torch_fast.loaded  # the later parts as a user gets them
    return res


def summarize(doc) -> None:
    def gm(xs):
        xs = [x for x in xs if x and x > 0]
        return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None

    s = {}
    rows = doc["parts"].get("decode") or []
    for page in PAGES:
        rs = [r for r in rows if r["page_size"] == page and "gbps" in (r.get("paged_vllm") or {})]
        if not rs:
            continue
        ent = {"n": len(rs)}
        long = [r for r in rs if r["seqlen_k"] >= 8192]
        ent["copy_frac_ge8k_geomean"] = gm([r["paged_vllm"]["gbps"] / r["copy_gbps"] for r in long])
        ent["copy_frac_ge8k_min"] = min((r["paged_vllm"]["gbps"] / r["copy_gbps"] for r in long), default=None)
        best = [r["paged_vllm"]["gbps"] / max((r.get(p) or {}).get("gbps", 0) for p in ("sdpa_flash", "sdpa_cudnn"))
                for r in rs if max((r.get(p) or {}).get("gbps", 0) for p in ("sdpa_flash", "sdpa_cudnn"))]
        ent["vs_best_sdpa_geomean"] = gm(best)
        ent["vs_best_sdpa_min"] = min(best, default=None)
        ent["ge_best_sdpa"] = sum(1 for x in best if x >= 1.0)
        s[f"decode_page{page}"] = ent
    vec = [r for r in rows if "gbps" in (r.get("paged_vectorized") or {})]
    if vec:
        best = [r["paged_vectorized"]["gbps"] / max((r.get(p) or {}).get("gbps", 0) for p in ("sdpa_flash", "sdpa_cudnn"))
                for r in vec]
        s["decode_page16_vectorized"] = {"n": len(vec), "vs_best_sdpa_geomean": gm(best),
                                         "vs_linear_geomean": gm([r["paged_vectorized"]["gbps"] / r["paged_vllm"]["gbps"]
                                                                  for r in vec if "gbps" in (r.get("paged_vllm") or {})])}
    rows = doc["parts"].get("prefill") or []
    for page in PAGES:
        rs = [r for r in rows if r["page_size"] == page and "tflops" in (r.get("paged") or {})]
        if rs:
            ov = [r["paged"]["tflops"] / r["attention_varlen"]["tflops"] for r in rs
                  if "tflops" in (r.get("attention_varlen") or {})]
            cu = [r["paged"]["tflops"] / r["sdpa_cudnn"]["tflops"] for r in rs if "tflops" in (r.get("sdpa_cudnn") or {})]
            s[f"prefill_page{page}"] = {"n": len(rs), "vs_varlen_geomean": gm(ov), "vs_varlen_min": min(ov, default=None),
                                        "vs_cudnn_geomean": gm(cu)}
    rows = doc["parts"].get("chunked") or []
    rs = [r for r in rows if "tflops" in (r.get("paged") or {}) and "tflops" in (r.get("attention_varlen") or {})]
    if rs:
        ov = [r["paged"]["tflops"] / r["attention_varlen"]["tflops"] for r in rs]
        s["chunked_page16"] = {"n": len(rs), "vs_varlen_geomean": gm(ov), "vs_varlen_min": min(ov)}
    doc["summary"] = s
    print(json.dumps(s, indent=1))


if __name__ == "__main__":
    main()
