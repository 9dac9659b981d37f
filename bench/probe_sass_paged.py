"""Instructions per key block of the serving template's sm90 builds, read from their SASS: no GPU needed.

    python bench/probe_sass_paged.py [--qscale pertensor,kv_blockscale,per_token_head] [--pages 16,1024]
                                     [--tiles 128x64w8,64x128w4,...] [--pipelines qr,qr_nwarp_sshuffle]
                                     [--causal] [--v-rows on|off|build]

Each FP8 ``batch_prefill`` key (d128) is compiled for sm90 with the installed Triton, as the build compiles it, and
its cubin read with Triton's bundled ``cuobjdump``: for every key-block loop (a backward branch whose body holds a
tensor-core MMA) the number of instructions, and the kernel's registers and spilled bytes.  A loop issues its
instructions from few warps per SM, so where the MMAs are short, as with FP8, this count bounds the speed
(docs/benchmarks.md, "FP8 per-key V descales on V's rows", took its figures from here with Triton 3.6).
``--v-rows on|off`` forces the ``V_ROWS`` constexpr for every key whose V descale is per key (the A/B of the
build's choice); ``build`` (the default) keeps what :func:`fmha_dsl.kernels.paged_host.constexprs` decides.
"""

from __future__ import annotations

import argparse
import re


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qscale", default="pertensor,kv_blockscale,per_token_head")
    ap.add_argument("--pages", default="16,1024")
    ap.add_argument("--tiles", default="128x64w8,64x128w4,64x64w4")
    ap.add_argument("--pipelines", default="qr_nwarp_sshuffle")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--v-rows", choices=("build", "on", "off"), default="build")
    args = ap.parse_args()
    tiles = [re.fullmatch(r"(\d+)x(\d+)w(\d+)", t) for t in args.tiles.split(",")]
    if not all(tiles):
        ap.error(f"--tiles: each M0xN0wWARPS, e.g. 128x64w8, got {args.tiles!r}")
    if not all(p.isdigit() for p in args.pages.split(",")):
        ap.error(f"--pages: page sizes, e.g. 16,1024, got {args.pages!r}")

    import fmha_dsl
    import fmha_dsl.kernels.triton_paged as paged
    from fmha_dsl import sass as cubin_sass
    from fmha_dsl.compile_triton import compile_key

    if not cubin_sass.available():
        raise SystemExit("Triton's bundled cuobjdump is missing")
    if args.v_rows != "build":
        decide = paged.constexprs

        def forced(sig, alg):
            c = decide(sig, alg)
            if paged.v_descale_per_key(c["KV_SCALE"], c["PAGE_SIZE"], c["BLOCK_N"]) and not c["KV_VEC"]:
                c["V_ROWS"] = args.v_rows == "on"
            return c

        paged.constexprs = forced   # compile_key looks the template's constexprs up at each call
    print(f"{'qscale':15} {'page':>5} {'tile':>10} {'pipeline':18} {'V_ROWS':>6} {'regs':>4} {'spill':>5}  loops")
    for qscale in args.qscale.split(","):
        for page in (int(p) for p in args.pages.split(",")):
            for tile in tiles:
                m0, n0, warps = tile.groups()
                for pipeline in args.pipelines.split(","):
                    src = """kernel_set p { backend(triton) arch(sm90) dtype(fp8bf16) hdim(128)
  kernel k { signature { family(batch_prefill) qscale(%s) mask(%s) kv_cache(linear, vllm, %d) }
             algorithm { pipeline(%s) tile(%s, %s, *, *, *, *) wave(%s, *, *, *, *, *, *, *, *)
                         padding(true, true, false, false) } } }""" % (
                        qscale, "causal" if args.causal else "no", page, pipeline, m0, n0, warps)
                    try:   # a qscale, pipeline or page size the rules refuse: exit 2 with the located error
                        entries = list(fmha_dsl.loads(src, path="probe.fmha").registry(arch="sm90"))
                    except fmha_dsl.FmhaError as exc:   # name the flags the value came from, not the set's text
                        hint = f"; {exc.hint}" if exc.hint else ""
                        ap.exit(2, f"probe_sass_paged.py: --qscale {qscale} --pages {page} --pipelines {pipeline}: "
                                   f"{exc.message}{hint}\n")
                    for e in entries:
                        meta, data = compile_key(e.sig, e.alg, "sm90")
                        if meta is None:
                            print(f"{qscale:15} {page:5} {tile.group(0):>10} {pipeline:18} failed: {data}")
                            continue
                        loops = sorted(len(b) for b in cubin_sass.loops(cubin_sass.listing(data), mma=True))
                        res = meta.get("resources", {})
                        v_rows = paged.constexprs(e.sig, e.alg).get("V_ROWS", "-")   # (absent before session 33)
                        print(f"{qscale:15} {page:5} {tile.group(0):>10} {pipeline:18} {str(v_rows):>6} "
                              f"{res.get('regs', '?'):>4} {res.get('spills', '?'):>5}  {loops}")


if __name__ == "__main__":
    main()
