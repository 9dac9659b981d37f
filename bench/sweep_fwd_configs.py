"""Sweep the forward template's launch configurations on this GPU: which tiles, warp counts, stage counts and
K/V load paths (pointer loads or TMA descriptors) are worth adding to the Triton backend's tables.

    python3 -P bench/sweep_fwd_configs.py [--json PATH] [--seqlens 512,2048,8192] [--dtype fp16] [-j 16]
        [--tiles 128x64w4,...] [--stagings 3:qr_async,2:qr_async_trload,...] [--knobs none,maxnreg168,...]
        [--hdims 64,128] [--causal 0,1] [--tokens 16384] [--once]

The product template (``fmha_dsl.kernels.triton_fwd.fmha_fwd``) runs through Triton's JIT with the constexprs the
build would give it (batch mode, no padding, causal or not), 16 heads, 16k tokens per batch; cuDNN (SDPA) is
timed in the same run.  Every configuration's output is checked against SDPA before it is timed.  Compiles
run first in ``-j`` worker processes (they fill Triton's on-disk cache); timing is serial.  A knob sets a template
constexpr on top of what the build gives (an experiment's switch: ``name`` for True, ``name=N`` for an int) or
Triton's register cap (``maxnreg<N>``).  ``--once`` launches each configuration once, untimed, for a profiler
(``ncu -k regex:fmha_fwd ... --once``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

TILES = "128x64w4,128x64w8,128x128w8,128x128w4,64x64w4,64x128w4"
# num_stages:pipeline -- pointer loads (qr: 1 stage, qr_async: cp.async), K/V through TMA descriptors (qr_async_trload)
STAGINGS = "3:qr_async,2:qr_async_trload,3:qr_async_trload"
# '+'-joined extras on top of each (tile, staging): a template constexpr set to True (by name, lower case), or
# maxnreg<N> (Triton's per-thread register cap); "none" is what the build ships
KNOBS = "none"


def _parse_configs(tiles: str, stagings: str, knobs: str) -> list:
    """``[(tile (m, n, warps), stages, pipeline, knob)]`` from the command line's lists; a knob is a tuple of
    ``(name, value)`` items (constexprs upper case, ``maxnreg`` an int).  Raises ValueError naming a bad item."""
    out = []
    for t in tiles.split(","):
        try:
            mn, w = t.split("w")
            m, n = mn.split("x")
            tile = (int(m), int(n), int(w))
        except ValueError:
            raise ValueError(f"--tiles item {t!r}: expected MxNwW, e.g. 128x64w4") from None
        for st in stagings.split(","):
            try:
                stages, pipe = st.split(":")
                stages = int(stages)
            except ValueError:
                raise ValueError(f"--stagings item {st!r}: expected stages:pipeline, e.g. 3:qr_async") from None
            for kn in knobs.split(","):
                items = []
                for item in ("" if kn == "none" else kn).split("+"):
                    try:
                        if item.startswith("maxnreg"):
                            items.append(("maxnreg", int(item[7:])))
                        elif "=" in item:
                            key, val = item.split("=")
                            items.append((key.upper(), int(val)))
                        elif item:
                            items.append((item.upper(), True))
                    except ValueError:
                        raise ValueError(f"--knobs item {item!r}: expected name, name=N or maxnreg<N>") from None
                out.append((tile, stages, pipe, tuple(items)))
    return out


def _tag(knob) -> str:
    return "".join(f"_{k.lower()}" if v is True else f"_{k.lower()}{v}" for k, v in knob)


def _name(tile, stages, pipe, knob):
    return f"{tile[0]}x{tile[1]}w{tile[2]}_s{stages}_{'tma' if 'trload' in pipe else 'ptr'}{_tag(knob)}"


def _options(tile, stages, knob) -> dict:
    opts = {"num_warps": tile[2], "num_stages": stages}
    opts.update({k: v for k, v in knob if k == "maxnreg"})
    return opts


def _inputs(d, causal, s, dtype, tokens=16384, device="cuda"):
    """q, k, v, an output (seed 0; ``tokens`` per batch, 16 heads) and the template's packed run-time arguments."""
    import torch

    from fmha_dsl.kernels import fwd_host as H

    b, h = max(1, tokens // s), 16
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device=device, dtype=tdt, generator=g) for _ in range(3))
    o = torch.empty_like(q)
    args = H.pack_args(q=q, k=k, v=v, out=o, q_strides=q.stride(), k_strides=k.stride(), v_strides=v.stride(),
                       out_strides=o.stride(), nhead_q=h, nhead_k=h, head_dim_q=d, head_dim_v=d, seqlen_q=s,
                       seqlen_k=s, lse=o, bias=o, alibi=o, cu_seqlens_q=o, cu_seqlens_k=o,
                       window_left=-1, window_right=0 if causal else -1)
    return (q, k, v, o), args


def _kernel(d, causal, s, dtype, tile, pipe, knob, tokens=16384):
    """The constexprs the build gives this configuration (batch mode, no padding) and its launch grid."""
    from fmha_dsl.kernels import fwd_host as H

    sig = {"dtype": dtype, "hdim_q": d, "hdim_v": d, "mask": "top_left" if causal else "no"}
    const = H.constexprs(sig, {"tile": tile[:2], "pipeline": pipe, "pad_s": 0, "pad_sk": 0, "pad_d": 0, "pad_dv": 0})
    const.update({k: v for k, v in knob if k != "maxnreg"})
    return const, H.grid(max(1, tokens // s), 16, s, tile[0])


def _allocator():
    import torch
    import triton

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


def _compile(job):
    """Worker: compile one configuration (fills Triton's cache); returns an error line or None."""
    d, causal, dtype, tile, stages, pipe, knob = job
    _allocator()
    from fmha_dsl.kernels import triton_fwd as T

    try:
        _, args = _inputs(d, causal, 1024, dtype)
        const, grid = _kernel(d, causal, 1024, dtype, tile, pipe, knob)
        T.fmha_fwd.warmup(*args, **const, grid=grid, **_options(tile, stages, knob))
        return None
    except Exception as exc:  # noqa: BLE001  (reported per configuration)
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--seqlens", default="512,2048,8192")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--hdims", default="64,128")
    ap.add_argument("--tokens", type=int, default=16384, help="tokens per batch (batch = tokens // seqlen)")
    ap.add_argument("--causal", default="0,1", help="0 (no mask), 1 (causal) or both")
    ap.add_argument("--tiles", default=TILES, help="MxNwW,...")
    ap.add_argument("--stagings", default=STAGINGS, help="stages:pipeline,...")
    ap.add_argument("--knobs", default=KNOBS, help="none,maxnreg168,<constexpr>,<constexpr>=N,... ('+' joins)")
    ap.add_argument("--once", action="store_true", help="launch each configuration once, untimed (for a profiler)")
    ap.add_argument("-j", type=int, default=16)
    args = ap.parse_args(argv)
    try:
        configs = _parse_configs(args.tiles, args.stagings, args.knobs)
    except ValueError as exc:
        ap.error(str(exc))

    import torch
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fmha_dsl.compile_pool import run_isolated
    from fmha_dsl.kernels import triton_fwd as T

    _allocator()
    hdims = [int(x) for x in args.hdims.split(",")]
    masks = [bool(int(c)) for c in args.causal.split(",")]
    jobs = [(d, c, args.dtype, t, st, p, kn) for d in hdims for c in masks for (t, st, p, kn) in configs]
    errors = {}  # a compiler that crashes (Triton asserts abort the process) fails its configuration only

    def done(i, res):
        errors[jobs[i]] = res[1] if isinstance(res, tuple) else res

    run_isolated(_compile, [(job,) for job in jobs], args.j, done)
    F = torch.nn.functional
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "dtype": args.dtype, "tokens": args.tokens}
    print(json.dumps(info), flush=True)
    rows = []
    for d, causal in itertools.product(hdims, masks):
        for s in (int(x) for x in args.seqlens.split(",")):
            row = {"d": d, "causal": causal, "seqlen": s, "configs": {}}
            flops = 4 * max(1, args.tokens // s) * 16 * s * s * d / (2 if causal else 1)
            (q, k, v, o), kargs = _inputs(d, causal, s, args.dtype, args.tokens)
            ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            if args.once:
                row["cudnn"] = float("nan")
            else:
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    row["cudnn"] = flops / triton.testing.do_bench(
                        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)) * 1e-9
            for tile, stages, pipe, knob in configs:
                name = _name(tile, stages, pipe, knob)
                err = errors[(d, causal, args.dtype, tile, stages, pipe, knob)]
                if err:
                    row["configs"][name] = err
                    continue
                const, grid = _kernel(d, causal, s, args.dtype, tile, pipe, knob, args.tokens)

                def go(const=const, grid=grid, opts=_options(tile, stages, knob)):
                    T.fmha_fwd[grid](*kargs, **const, **opts)

                if args.once:
                    go()
                    torch.cuda.synchronize()
                    continue
                try:
                    o.fill_(float("nan"))  # the output is shared: a configuration that writes nothing must fail
                    go()
                    torch.cuda.synchronize()
                    e = (o.float() - ref.float()).abs().max().item()
                    if not e < 2e-2:
                        row["configs"][name] = f"wrong ({e:.3g})"
                        continue
                    row["configs"][name] = round(flops / triton.testing.do_bench(go) * 1e-9, 1)
                except Exception as exc:  # noqa: BLE001
                    row["configs"][name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            ok = {n: t for n, t in row["configs"].items() if isinstance(t, float)}
            # what the shipped tables have: pointer loads with 3 stages, TMA (K/V) with 2 and 3, no knob
            cur = {n: t for n, t in ok.items() if n.endswith(("_s3_ptr", "_s2_tma", "_s3_tma"))}
            best = max(ok, key=ok.get) if ok else None
            row.update(best=best, best_tflops=ok.get(best), current_best=max(cur.values(), default=None))
            print(f"d{d} {'C' if causal else 'N'} s{s}: cudnn {row['cudnn']:.0f} | current table {row['current_best']} "
                  f"| sweep best {row['best_tflops']} ({best}) = {(row['best_tflops'] or 0) / row['cudnn']:.3f}x cudnn",
                  flush=True)
            by_knob = {}
            for tile, stages, pipe, knob in configs:
                tag = _tag(knob) or "_none"
                t = ok.get(_name(tile, stages, pipe, knob), 0.0)
                by_knob[tag] = max(by_knob.get(tag, 0.0), t)
            row["best_by_knob"] = by_knob
            print("    best per knob: " + ", ".join(f"{k[1:]} {t:.0f}" for k, t in by_knob.items()), flush=True)
            top = sorted(ok.items(), key=lambda kv: -kv[1])[:6]
            print("    " + " | ".join(f"{n} {t:.0f}" for n, t in top), flush=True)
            bad = sorted({t for t in row["configs"].values() if isinstance(t, str)})
            for b in bad[:2]:
                print("    !", b, flush=True)
            rows.append(row)
    path = args.json or (os.path.join(os.environ["OUT"], "sweep_fwd_configs.json") if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
