"""Compile the one kernel a problem needs, on first use (what :func:`fmha_dsl.attention` does without a registry).

The key comes from the same ``.fmha`` declaration the ``dispatch.no-kernel`` error suggests
(:func:`fmha_dsl.runtime.dispatch.declaration_for`: Triton backend, every dim padded, ``pipeline(*)``,
``tile(*)``), expanded by the arch rules like any kernel set; the tile is then picked from a small per-arch
table by head dim (``qr_async`` before ``qr``):

    =========  ==========  ==========================  =====================================================
    arch       head dim    (m0, n0, warps)              why
    =========  ==========  ==========================  =====================================================
    sm90       <= 64       (128, 64, 4)                 one warpgroup, wgmma m64; small accumulators
    sm90       <= 128      (128, 64, 8)                 two warpgroups keep the 128x128 accumulator unspilled
    sm90       <= 256      (64, 64, 4)                  fits shared memory with 3 stages
    sm80       <= 64       (128, 64, 4)
    sm80       <= 256      (64, 64, 4)                  (128, 64, 4) is at the register budget's edge at d=128
    gfx9xx     <= 128      (128, 64, 4)                 CDNA MFMA 32x32
    gfx9xx     <= 256      (64, 64, 4)
    gfx11/12   any         (64, 32, 4)                  RDNA WMMA, 64 KiB LDS
    =========  ==========  ==========================  =====================================================

When the table's tile is not among the rule-checked candidates, the dispatcher's static preference decides.
Only pointer-load pipelines are compiled here (``qr_async``, else ``qr``): they serve aligned and unaligned
arguments alike and replay on the torch fast path; the TMA pipelines (sm90) come from built registries.
The binary goes through the build's content-addressed cache (:mod:`fmha_dsl.cache`, the same entries
``fmha-dsl build --backend triton`` uses), so a second process loads it without compiling.

This module imports the build machinery (lark, triton) only when a kernel is actually compiled.
"""

from __future__ import annotations

from fmha_dsl.errors import error
from fmha_dsl.registry import Entry

TILE_TABLE: dict[str, tuple[tuple[int, tuple[int, int, int]], ...]] = {
    "sm90": ((64, (128, 64, 4)), (128, (128, 64, 8)), (256, (64, 64, 4))),
    "sm80": ((64, (128, 64, 4)), (256, (64, 64, 4))),
    "gfx90a": ((128, (128, 64, 4)), (256, (64, 64, 4))),
    "gfx942": ((128, (128, 64, 4)), (256, (64, 64, 4))),
    "gfx950": ((128, (128, 64, 4)), (256, (64, 64, 4))),
    "gfx1100": ((256, (64, 32, 4)),),
    "gfx1201": ((256, (64, 32, 4)),),
}


def table_tile(arch: str, hdim: int):
    """``(m0, n0, warps)`` the table gives for ``arch`` and the larger head dim, or None."""
    for bound, tile in TILE_TABLE.get(arch, ()):
        if hdim <= bound:
            return tile
    return None


def choose(entries, problem, arch: str):
    """The entry to compile among rule-checked ``entries`` that serve ``problem``."""
    from .match import mismatches, preference

    from fmha_dsl.rules.triton_fwd import uses_tma

    ok = sorted((e for e in entries if not mismatches(e, problem) and not uses_tma(e.alg["pipeline"])), key=preference)
    if not ok:
        return None
    want = table_tile(arch, max(problem.hdim_q, problem.hdim_v))
    if want is not None:
        for e in ok:
            if (e.alg["tile"][0], e.alg["tile"][1], e.alg["wave"][0]) == want:
                return e
    return ok[0]


def candidates(problem, arch: str):
    """Rule-checked entries of the declaration that serves ``problem`` (parsing and expansion: lark)."""
    import fmha_dsl

    from .match import declaration_for

    text = declaration_for(problem, arch, name="jit")
    try:
        return list(fmha_dsl.loads(text, path="<jit>").registry(arch=arch))
    except fmha_dsl.RuleError:  # the rules drop every tile (e.g. shared memory): no candidate
        return []


def compile_entry(e: Entry, cache_dir: str | None = None, aligned: bool = True) -> tuple[dict, bytes]:
    """``(build meta, binary)`` of an entry, from the artifact cache or compiled (and then cached)."""
    from fmha_dsl.cache import ArtifactCache, content_key, sha256_bytes

    try:
        from fmha_dsl.compile_triton import cache_parts, compile_key
    except ImportError as exc:  # pragma: no cover
        raise error("runtime.jit", f"cannot compile kernels: {exc}") from None
    try:
        parts = cache_parts(e.sig, e.alg, e.arch, aligned)
    except ImportError:
        raise error("runtime.jit", "compiling kernels on first use needs Triton, which is not installed", None,
                    "pip install triton, or pass registry= a prebuilt build directory") from None
    cache = ArtifactCache.of(cache_dir)  # the build and the JIT share it
    key = content_key(parts)
    hit = cache.get(key)
    if hit is not None:
        meta, data = hit
    else:
        meta, data = compile_key(e.sig, e.alg, e.arch, aligned)
        if meta is None:
            raise error("runtime.jit", f"compiling {e.name} failed: {data}", None,
                        "report this with the problem's shapes; meanwhile pass a registry built elsewhere")
        cache.put(key, meta, data, f"kernel.{meta['binary_kind']}")
        meta = dict(meta, sha256=sha256_bytes(data), size=len(data))
    build = {k: v for k, v in meta.items() if k != "file"}
    build.update(binary=None, cache_key=key)
    return build, data


def compile_for(problem, arch: str, cache_dir: str | None = None, aligned: bool = True) -> tuple[Entry, bytes]:
    """Declare, expand, pick and compile the kernel for ``problem``: ``(Entry with build, binary)``.

    ``aligned=False`` compiles without the 16-divisibility promise (arguments with odd strides/pointers)."""
    entries = candidates(problem, arch)
    e = choose(entries, problem, arch)
    if e is None:
        from .match import describe

        raise error("runtime.jit", f"the Triton rules allow no kernel for {describe(problem)} on {arch}", None,
                    "the head dims, dtype or features exceed what the Triton template supports on this arch")
    if not aligned:  # a distinct key (CK's constraint tag), so it sits next to the aligned variant of the same kernel
        e = Entry(None, e.name + "_unaligned", e.source, e.build, sig=e.sig, alg=dict(e.alg, constraint="unaligned"),
                  arch=e.arch)
    build, data = compile_entry(e, cache_dir, aligned)
    return Entry(None, e.name, "<jit>", build, sig=e.sig, alg=e.alg, arch=e.arch, ident=e.identifier), data


def precompile(problems, arch: str, jobs: int | None = None, cache_dir: str | None = None) -> int:
    """Compile (in parallel worker processes) the kernels :func:`compile_for` would pick for ``problems``, into
    the artifact cache, so that later first uses only load them.  Returns how many were compiled; one that fails
    is left for its first use, which reports why."""
    import os

    from fmha_dsl.cache import ArtifactCache, content_key
    from fmha_dsl.compile_pool import run_isolated
    from fmha_dsl.compile_triton import cache_parts

    cache = ArtifactCache.of(cache_dir)  # the build and the JIT share it
    todo = {}
    for p in problems:
        e = choose(candidates(p, arch), p, arch)
        if e is None:
            continue
        key = content_key(cache_parts(e.sig, e.alg, e.arch))
        if key not in todo and cache.get(key) is None:
            todo[key] = e
    if not todo:
        return 0
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(todo)))
    from fmha_dsl.build_triton import _compile_in_worker

    items = list(todo.items())
    stored = []

    def store(i, result):  # a kernel that failed (or crashed its compiler) is compiled, and reported, on first use
        meta, data = result
        if meta is not None:
            cache.put(items[i][0], meta, data, f"kernel.{meta['binary_kind']}")
            stored.append(i)

    run_isolated(_compile_in_worker, [("kernel", e.sig, e.alg, e.arch) for _, e in items], jobs, store)
    return len(stored)


__all__ = ["TILE_TABLE", "table_tile", "choose", "candidates", "compile_entry", "compile_for", "precompile"]
