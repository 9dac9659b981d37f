"""[build] Compile the Triton kernels of a kernel set into a build directory.

    DIR/registry.json                   every kernel that compiled, each with a ``build`` object
    DIR/kernels/<arch>/<name>.<hsaco|cubin>
    DIR/build-report.json               what failed (and why), what was dropped for spilling, timings

Each kernel's cache key covers its key fields, the template's source hash, the Triton version, the
target and the compile options; a rebuild with nothing changed compiles nothing.  Compilation runs in a
pool of worker processes; the parent alone writes the cache and the build directory, every file
atomically, and the registry last -- a build killed at any moment leaves a cache and directory the next
run reuses.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from .cache import ArtifactCache, content_key, sha256_bytes
from .errors import UsageError, error
from .expand import expand
from .registry import Entry, Registry, write_atomic


def _compile_in_worker(sig: dict, alg: dict, arch: str):
    from .compile_triton import compile_key

    return compile_key(sig, alg, arch)


def build_with_triton(kernel_set, out: str, archs, profile, backend, jobs: int, progress, no_spills: bool,
                      cache_dir: str | None):
    from .build import BuildResult
    from .compile_triton import cache_parts

    try:
        import triton  # noqa: F401
    except ImportError:
        raise error("build.no-triton", "the triton backend needs Triton, which is not installed", None,
                    "pip install 'fmha-dsl[triton]'", cls=UsageError) from None
    t0 = time.perf_counter()
    rep = expand(kernel_set.declarations, archs, profile, backend)
    triton_ids = {k.identifier for k in rep.kernels if k.backend == "triton"}
    reg = kernel_set.registry(profile=profile, report=rep)
    cache = ArtifactCache(os.path.join(cache_dir, "kernels") if cache_dir else None)

    todo, ready, failures, spilled = [], {}, [], []
    for e in reg:
        if e.identifier not in triton_ids:
            continue
        key = content_key(cache_parts(e.sig, e.alg, e.arch))
        hit = cache.get(key)
        if hit is not None:
            ready[e.identifier] = (key, hit[0], hit[1], True)
        else:
            todo.append((e, key))
    total = len(ready) + len(todo)
    done = hits = len(ready)
    if progress:
        progress(done, total, 0, hits)

    def finish(e: Entry, key: str, result):
        nonlocal done
        meta, data = result
        done += 1
        if meta is None:
            failures.append({"name": e.name, "arch": e.arch, "reason": str(data)})
        else:
            cache.put(key, meta, data, f"kernel.{meta['binary_kind']}")
            ready[e.identifier] = (key, dict(meta, sha256=sha256_bytes(data), size=len(data)), data, False)
        if progress:
            progress(done, total, len(failures), hits)

    if todo and jobs > 1:
        ctx = multiprocessing.get_context("spawn")  # compilers in fresh processes, no inherited state
        with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=ctx) as pool:
            futs = {pool.submit(_compile_in_worker, e.sig, e.alg, e.arch): (e, key) for e, key in todo}
            for fut in as_completed(futs):
                e, key = futs[fut]
                try:
                    result = fut.result()
                except Exception as exc:  # noqa: BLE001  (a crashed worker fails one kernel, not the build)
                    result = (None, f"worker failed: {type(exc).__name__}: {exc}")
                finish(e, key, result)
    else:
        for e, key in todo:
            finish(e, key, _compile_in_worker(e.sig, e.alg, e.arch))

    kept = Registry(reg.name, profiles=reg.profiles, sources=reg.sources)
    compiled = cached = 0
    for e in reg:
        if e.identifier not in triton_ids:
            kept.add(e)
            continue
        got = ready.get(e.identifier)
        if got is None:
            continue
        key, meta, data, from_cache = got
        res = meta.get("resources", {})
        if no_spills and res.get("spills", 0) > 0:
            spilled.append({"name": e.name, "arch": e.arch, "spills": res.get("spills")})
            continue
        rel = f"kernels/{e.arch}/{e.name}.{meta['binary_kind']}"
        write_atomic(os.path.join(out, rel), data)
        build = {k: v for k, v in meta.items() if k not in ("file",)}
        build.update(binary=rel, cache_key=key)
        kept.add(Entry(None, e.name, e.source, build, sig=e.sig, alg=e.alg, arch=e.arch, ident=e.identifier))
        cached += from_cache
        compiled += not from_cache
    failures.sort(key=lambda f: (f["arch"], f["name"]))
    spilled.sort(key=lambda f: (f["arch"], f["name"]))
    path = os.path.join(out, "registry.json")
    kept.save(path)
    seconds = time.perf_counter() - t0
    write_atomic(os.path.join(out, "build-report.json"), json.dumps(
        {"compiled": compiled, "cached": cached, "failed": failures, "dropped_for_spills": spilled,
         "kernels": len(kept), "seconds": round(seconds, 3), "jobs": jobs}, indent=1, sort_keys=True) + "\n")
    return BuildResult(path, len(kept), kept.statistics()["by_arch"], rep, compiled, cached, failures, seconds)


__all__ = ["build_with_triton"]
