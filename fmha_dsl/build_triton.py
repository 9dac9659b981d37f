"""[build] Compile the Triton kernels of a kernel set into a build directory.

    DIR/registry.json                   every kernel that compiled, each with a ``build`` object
    DIR/kernels/<arch>/<name>.<hsaco|cubin>
    DIR/build-report.json               what failed (and why), what was dropped for spilling, timings

Each kernel's cache key covers its key fields, the template's source hash, the Triton version, the
target and the compile options; a rebuild with nothing changed compiles nothing.  Compilation runs in
worker processes (:mod:`fmha_dsl.compile_pool`: a compiler crash fails that kernel only); the parent alone
writes the cache and the build directory, every file atomically, and the registry last -- a build killed at
any moment leaves a cache and directory the next run reuses.
"""

from __future__ import annotations

import json
import os
import time

from .cache import ArtifactCache, content_key, sha256_bytes
from .compile_pool import run_isolated
from .errors import UsageError, error
from .expand import expand, nothing_to_build
from .registry import Entry, Registry, registry_path, write_atomic


def _compile_in_worker(kind: str, sig: dict, alg: dict | None, arch: str):
    from .compile_triton import compile_combine, compile_key

    return compile_key(sig, alg, arch) if kind == "kernel" else compile_combine(sig, arch)


def build_with_triton(kernel_set, out: str, archs, profile, backend, jobs: int, progress, no_spills: bool,
                      cache_dir: str | None):
    """Expand, compile (through the cache) and write the build directory; returns the fields of
    :class:`fmha_dsl.build.BuildResult` as a dict (:func:`fmha_dsl.build.build` wraps them, so this module,
    below ``build``, never imports it)."""
    from .compile_triton import cache_parts, combine_name, combine_parts

    try:
        import triton  # noqa: F401
    except ImportError:
        raise error("build.no-triton", "the triton backend needs Triton, which is not installed", None,
                    "pip install 'fmha-dsl[triton]'", cls=UsageError) from None
    t0 = time.perf_counter()
    rep = expand(kernel_set.declarations, archs, profile, backend)
    if not rep.kernels:
        raise nothing_to_build(kernel_set, rep, archs)
    triton_ids = {k.identifier for k in rep.kernels if k.backend == "triton"}
    reg = kernel_set.registry(profile=profile, report=rep)
    cache = ArtifactCache.of(cache_dir)

    # jobs: one per kernel, plus one per distinct combine kernel the split-KV kernels need (shared by many)
    todo, ready, failures, spilled = [], {}, [], []
    key_of: dict[str, str] = {}       # kernel id -> its cache key
    combine_of: dict[str, str] = {}   # split kernel id -> its combine's cache key
    combine_jobs: dict[str, tuple] = {}
    for e in reg:
        if e.identifier not in triton_ids:
            continue
        key = key_of[e.identifier] = content_key(cache_parts(e.sig, e.alg, e.arch))
        mine = [("kernel", key, e.sig, e.alg, e.arch, e.name)]
        if e.sig["family"] == "fwd_splitkv":
            ckey = content_key(combine_parts(e.sig, e.arch))
            combine_of[e.identifier] = ckey
            if ckey not in combine_jobs:
                combine_jobs[ckey] = ("combine", ckey, e.sig, None, e.arch, combine_name(e.sig, e.arch))
                mine.append(combine_jobs[ckey])
        for job in mine:
            hit = cache.get(job[1])
            if hit is not None:
                ready[job[1]] = (hit[0], hit[1], True)
            else:
                todo.append(job)
    total = len(ready) + len(todo)
    done = hits = len(ready)
    if progress:
        progress(done, total, 0, hits)
    why_failed: dict[str, str] = {}

    def finish(job, result):
        nonlocal done
        kind, key, _, _, arch, name = job
        meta, data = result
        done += 1
        if meta is None:
            why_failed[key] = str(data)
            if kind == "kernel":
                failures.append({"name": name, "arch": arch, "reason": str(data)})
        else:
            cache.put(key, meta, data, f"{kind}.{meta['binary_kind']}")
            ready[key] = (dict(meta, sha256=sha256_bytes(data), size=len(data)), data, False)
        if progress:
            progress(done, total, len(failures), hits)

    # every compile runs in a worker process: a compiler that crashes fails its kernel, not the build
    run_isolated(_compile_in_worker, [(job[0], job[2], job[3], job[4]) for job in todo], jobs,
                 lambda i, result: finish(todo[i], result))

    kept = Registry(reg.name, profiles=reg.profiles, sources=reg.sources)
    compiled = cached = 0
    written: set[str] = set()
    for e in reg:
        if e.identifier not in triton_ids:
            kept.add(e)
            continue
        key = key_of[e.identifier]
        got = ready.get(key)
        if got is None:
            continue
        meta, data, from_cache = got
        res = meta.get("resources", {})
        if no_spills and res.get("spills", 0) > 0:
            spilled.append({"name": e.name, "arch": e.arch, "spills": res.get("spills")})
            continue
        comb = None
        if e.identifier in combine_of:
            ckey = combine_of[e.identifier]
            if ckey not in ready:
                failures.append({"name": e.name, "arch": e.arch, "reason": "its split-KV combine kernel failed: "
                                 + why_failed.get(ckey, "not compiled")})
                continue
            cmeta, cdata, _ = ready[ckey]
            crel = f"kernels/{e.arch}/{combine_jobs[ckey][5]}.{cmeta['binary_kind']}"
            if crel not in written:
                write_atomic(os.path.join(out, crel), cdata)
                written.add(crel)
            comb = {k: v for k, v in cmeta.items() if k != "file"}
            comb.update(binary=crel, cache_key=ckey)
        rel = f"kernels/{e.arch}/{e.name}.{meta['binary_kind']}"
        write_atomic(os.path.join(out, rel), data)
        build = {k: v for k, v in meta.items() if k not in ("file",)}
        build.update(binary=rel, cache_key=key)
        if comb is not None:
            build["combine"] = comb
        kept.add(Entry(None, e.name, e.source, build, sig=e.sig, alg=e.alg, arch=e.arch, ident=e.identifier))
        cached += from_cache
        compiled += not from_cache
    failures.sort(key=lambda f: (f["arch"], f["name"]))
    spilled.sort(key=lambda f: (f["arch"], f["name"]))
    path = registry_path(out)
    kept.save(path)
    seconds = time.perf_counter() - t0
    write_atomic(os.path.join(out, "build-report.json"), json.dumps(
        {"compiled": compiled, "cached": cached, "failed": failures, "dropped_for_spills": spilled,
         "kernels": len(kept), "seconds": round(seconds, 3), "jobs": jobs}, indent=1, sort_keys=True) + "\n")
    return {"path": path, "total": len(kept), "by_arch": kept.statistics()["by_arch"], "report": rep,
            "compiled": compiled, "cached": cached, "failures": failures, "seconds": seconds}


__all__ = ["build_with_triton"]
