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
from . import compile_ahead
from .compile_pool import run_isolated
from .errors import FmhaError, UsageError, error
from .atomic_file import discard, publish, stage, write_atomic
from .registry import Entry, Registry, registry_path


def _compile_in_worker(kind: str, sig: dict, alg: dict | None, arch: str, aligned: bool = True):
    from .compile_triton import compile_companion, compile_key

    return compile_key(sig, alg, arch, aligned) if kind == "kernel" else compile_companion(sig, arch)


def _over_shared(meta: dict, arch: str) -> str | None:
    """Why a compiled kernel cannot launch on ``arch``: more shared memory (LDS) per block than the arch table allows
    (Triton checks it only at launch, on the device); None when it fits."""
    from . import arch as arch_table

    limit = arch_table.info(arch).get("shared_bytes")
    need = int(meta.get("shared") or 0)
    if limit and need > int(limit):
        return f"OutOfResources: needs {need} bytes of shared memory; {arch} allows {limit} per block"
    return None


# ---- compiling through the artifact cache (the build and the first-use builder) -------------------------------
def kernel_job(sig: dict, alg: dict, arch: str, aligned: bool = True) -> tuple[str, tuple]:
    """``(cache key, job)`` of one kernel: a job is ``_compile_in_worker``'s arguments."""
    from .compile_triton import cache_parts

    return content_key(cache_parts(sig, alg, arch, aligned)), ("kernel", sig, alg, arch) + (() if aligned else (False,))


def companion_jobs(sig: dict, arch: str, aligned: bool = True, alg: dict | None = None
                   ) -> list[tuple[str, str, str, tuple]]:
    """``[(role, name, cache key, job)]`` of the companion kernels a key of ``sig``'s family is built with (the
    split-KV combine kernel, the backward's dot_do_o and convert_dq; :mod:`fmha_dsl.kernels.abis`), each shared
    by every key that projects onto the same companion signature; a companion with promises of its own keeps them
    only in an ``aligned`` key's build."""
    from .kernels.abis import abi_of, companion_sig

    abi = abi_of(sig.get("family", "fwd"))
    return [(role, *companion_job(companion_sig(sig, family, aligned, alg), arch))
            for role, family in (abi.companions if abi is not None else ())]


def companion_job(csig: dict, arch: str) -> tuple[str, str, tuple]:
    """``(name, cache key, job)`` of the companion kernel of signature ``csig``
    (:func:`fmha_dsl.kernels.abis.companion_sig`)."""
    from .compile_triton import companion_parts
    from .kernels.abis import companion_name

    return companion_name(csig, arch), content_key(companion_parts(csig, arch)), ("companion", csig, None, arch)


_NOT_CACHED = "not in the kernel cache (FMHA_DSL_NO_BUILD is set)"


def compile_through_cache(wanted: dict, cache: ArtifactCache, workers: int, on_result=None,
                          cache_only: bool = False, why: dict | None = None, ahead: dict | None = None
                          ) -> tuple[dict, dict]:
    """Binaries for ``wanted`` (cache key -> job): ``(ready, why)`` with ``ready[key] = (meta, data, from_cache)``
    and ``why[key]`` the reason a job failed.  Cache hits are loaded; the rest compile in worker processes (a compiler
    crash fails its job only, :func:`fmha_dsl.compile_pool.run_isolated`) and are stored in the cache.  A kernel that
    needs more shared memory than its arch allows fails, from the cache too (:func:`_over_shared`).
    ``on_result(key, ok, cached)`` is called as each job finishes (the hits first).  ``cache_only``: nothing is
    compiled.

    ``ahead`` (cache key -> job): compiled *after* ``wanted``'s jobs, in the same batch of workers, in the background
    (:mod:`fmha_dsl.compile_ahead`): this returns once ``wanted``'s are in, and a later call that wants one of them
    waits for it instead of compiling it again.  First use hands it a training step's backward candidates while its
    forward compiles: the workers the forward's jobs leave idle start on them."""
    ready: dict[str, tuple] = {}
    why = {} if why is None else why  # filled before on_result hears of a failure
    todo, hits, waits = [], [], []
    keys = compile_ahead.AHEAD

    def accept(key, meta, data, cached):  # a kernel too large to launch is cached too: not compiled again to find out
        too_big = _over_shared(meta, wanted[key][3])  # a job is (kind, signature, algorithm, arch[, aligned])
        if too_big:
            why[key] = too_big
        else:
            ready[key] = (meta, data, cached)

    def settle(key, meta, data):  # a compile's result (meta None: data is the reason it failed), reported
        if meta is None:
            why[key] = str(data)
        else:
            accept(key, meta, data, False)
        if on_result:
            on_result(key, key in ready, False)

    for key, job in wanted.items():
        # a batch's key first, then the cache: the batch stores a binary before it lets the key go, so a key let go
        # between the two looks is in the cache (the other order could miss both and compile the key again)
        held = keys.holds(key)
        hit = cache.get(key)
        if hit is not None:
            hits.append(key)
            accept(key, hit[0], hit[1], True)
        elif held:
            waits.append(key)
        elif cache_only:
            why[key] = _NOT_CACHED
        else:
            todo.append((key, job))
    if on_result:
        for key in hits:
            on_result(key, key in ready, True)
    for key in waits:  # being compiled by an earlier call's batch: its result, else compiled here
        got = keys.wait(key) or cache.get(key)
        if got is None and not cache_only:  # that batch stopped before it
            todo.append((key, wanted[key]))
        else:
            settle(key, *(got or (None, _NOT_CACHED)))
    # Each key this call compiles is claimed first, then looked for in the cache once more (another batch may have
    # stored it and let it go since the first look): found, it is let go at once.  A claim is let go when its key is
    # done, and -- whoever holds the rest -- whenever the batch ends; in the background the batch holds them (a
    # caller interrupted while it waits leaves them to it, and a retry waits for them).
    claimed: set = set()   # the keys this call holds and has not let go
    todo_jobs, later = [], []
    try:
        for key, job in todo:
            if keys.claim(key):
                claimed.add(key)
                hit = cache.get(key)
                if hit is not None:  # compiled meanwhile by another batch
                    claimed.discard(key)
                    keys.done(key)
                    accept(key, hit[0], hit[1], True)
                    if on_result:
                        on_result(key, key in ready, True)
                    continue
            todo_jobs.append((key, job))  # (held by another batch since the first look: compiled here too)
        for key, job in () if cache_only or not ahead else ahead.items():
            if key not in wanted and keys.claim(key):
                claimed.add(key)
                if cache.has(key):
                    claimed.discard(key)
                    keys.done(key)
                else:
                    later.append((key, job))
    except BaseException:
        for key in claimed:
            keys.done(key)
        raise
    jobs = todo_jobs + later

    def finish(i, result):
        key, job = jobs[i]
        meta, data = result
        stored = meta is not None and cache.put(key, meta, data, f"{job[0]}.{meta['binary_kind']}")
        if meta is not None:
            meta = dict(meta, sha256=sha256_bytes(data), size=len(data))
        if key in claimed:  # a waiting call reads the cache, or (a job compiled ahead) gets what the cache lacks
            claimed.discard(key)
            keys.done(key, None if stored or i < len(todo_jobs) else (meta, data))
        if i < len(todo_jobs):  # (the jobs after them were compiled ahead, for a later call)
            settle(key, meta, data)

    # every compile runs in a worker process: a compiler that crashes fails its kernel, not the build
    n = max(1, min(workers, len(jobs) or 1))
    if later:  # (the batch lets go of what it still holds when it ends)
        compile_ahead.run_in_background(run_isolated, _compile_in_worker, [job for _, job in jobs], n, finish,
                                        len(todo_jobs), claimed)
    elif jobs:
        try:
            run_isolated(_compile_in_worker, [job for _, job in jobs], n, finish)
        finally:  # however it ends: a key it did not compile is compiled by whichever call wants it
            for key in list(claimed):
                keys.done(key)
    return ready, why


def build_record(meta: dict, key: str, binary: str | None, **extra) -> dict:
    """An entry's ``build`` object from a compile's metadata: where its binary is (None: held in memory) and its
    cache key."""
    build = {k: v for k, v in meta.items() if k != "file"}
    build.update(binary=binary, cache_key=key, **extra)
    return build


def build_with_triton(kernel_set, out: str, archs, profile, backend, jobs: int, progress, no_spills: bool,
                      cache_dir: str | None):
    """Expand, compile (through the cache) and write the build directory; returns the fields of
    :class:`fmha_dsl.build.BuildResult` as a dict (:func:`fmha_dsl.build.build` wraps them, so this module,
    below ``build``, never imports it)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        raise error("build.no-triton", "the triton backend needs Triton, which is not installed", None,
                    "pip install 'fmha-dsl[triton]'", cls=UsageError) from None
    from .expand import expand, nothing_to_build

    t0 = time.perf_counter()
    rep = expand(kernel_set.declarations, archs, profile, backend)
    if not rep.kernels:
        raise nothing_to_build(kernel_set, rep, archs)
    triton_ids = {k.identifier for k in rep.kernels if k.backend == "triton"}
    reg = kernel_set.registry(profile=profile, report=rep)
    cache = ArtifactCache.of(cache_dir)

    # jobs: one per kernel, plus one per distinct combine kernel the split-KV kernels need (shared by many)
    failures, spilled = [], []
    wanted: dict[str, tuple] = {}
    kernel_of: dict[str, tuple] = {}  # cache key of a kernel job -> (name, arch), for the failure report
    key_of: dict[str, str] = {}       # kernel id -> its cache key
    companions_of: dict[str, list] = {}  # kernel id -> [(role, name, cache key)] of its companion kernels
    for e in reg:
        if e.identifier not in triton_ids:
            continue
        key, job = kernel_job(e.sig, e.alg, e.arch)
        key_of[e.identifier] = key
        wanted[key] = job
        kernel_of[key] = (e.name, e.arch)
        comps = companion_jobs(e.sig, e.arch, alg=e.alg)
        if comps:
            companions_of[e.identifier] = [(role, name, ckey) for role, name, ckey, _ in comps]
            for _, _, ckey, cjob in comps:
                wanted[ckey] = cjob
    total, done, hits = len(wanted), 0, 0
    why_failed: dict[str, str] = {}

    def finish(key, ok, cached):
        nonlocal done, hits
        done += 1
        hits += cached
        if not ok and key in kernel_of:
            name, arch = kernel_of[key]
            failures.append({"name": name, "arch": arch, "reason": why_failed[key]})
        if progress:
            progress(done, total, len(failures), hits)

    path = registry_path(out)
    previous = existing_registry(path)   # (before anything is written: an unreadable registry stops the build)
    ready, _ = compile_through_cache(wanted, cache, jobs, finish, why=why_failed)

    kept = Registry(reg.name, profiles=reg.profiles, sources=reg.sources)
    staged: list[tuple[str, str]] = []   # (into place only once every binary is written: publish below)
    try:
        _collect(reg, triton_ids, key_of, ready, companions_of, why_failed, no_spills, spilled, failures, kept,
                 lambda rel, data: staged.append(stage(os.path.join(out, rel), data)))
        if len(kept):
            publish(staged)
    finally:
        discard(staged)
    compiled = sum(not ready[key_of[e.identifier]][2] for e in kept if e.identifier in key_of)
    cached = sum(bool(ready[key_of[e.identifier]][2]) for e in kept if e.identifier in key_of)
    failures.sort(key=lambda f: (f["arch"], f["name"]))
    spilled.sort(key=lambda f: (f["arch"], f["name"]))
    table, dropped = carried_table(previous, kept)
    if len(kept):  # (every kernel failed: a registry already there stays as it was, and none is written)
        kept.seqtune = table
        kept.save(path)
    seconds = time.perf_counter() - t0
    if len(kept):  # (a build that keeps nothing leaves the folder's registry and its report as they were)
        write_atomic(os.path.join(out, "build-report.json"), json.dumps(
            {"compiled": compiled, "cached": cached, "failed": failures, "dropped_for_spills": spilled,
             "kernels": len(kept), "seconds": round(seconds, 3), "jobs": jobs}, indent=1, sort_keys=True) + "\n")
    return {"path": path, "total": len(kept), "by_arch": kept.statistics()["by_arch"], "report": rep,
            "compiled": compiled, "cached": cached, "failures": failures, "seconds": seconds,
            "written": bool(len(kept)), "kept_table": bool(len(kept)) and table is not None, "spilled": len(spilled),
            "dropped_points": dropped if len(kept) else 0}


def _collect(reg, triton_ids, key_of, ready, companions_of, why_failed, no_spills, spilled, failures, kept, stage):
    """The registry's entries whose kernels (and companions) compiled, into ``kept``, their binaries staged."""
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
        comps, failed = {}, None
        for role, cname, ckey in companions_of.get(e.identifier, ()):
            if ckey not in ready:
                failed = f"its {role} kernel failed: " + why_failed.get(ckey, "not compiled")
                break
            cmeta, cdata, _ = ready[ckey]
            crel = f"kernels/{e.arch}/{cname}.{cmeta['binary_kind']}"
            if crel not in written:
                stage(crel, cdata)
                written.add(crel)
            comps[role] = build_record(cmeta, ckey, crel, name=cname)
        if failed:
            failures.append({"name": e.name, "arch": e.arch, "reason": failed})
            continue
        rel = f"kernels/{e.arch}/{e.name}.{meta['binary_kind']}"
        stage(rel, data)
        build = build_record(meta, key, rel, **comps)
        kept.add(Entry(None, e.name, e.source, build, sig=e.sig, alg=e.alg, arch=e.arch, ident=e.identifier))


def existing_registry(path: str) -> Registry | None:
    """The registry a build is about to replace (None: none there).  One there that this version cannot read stops
    the build before anything is written: replacing it would drop its measurements unseen (a newer schema, a hand
    edit gone wrong)."""
    if not os.path.lexists(path):
        return None
    try:
        old = Registry.load(path)
    except FmhaError as exc:
        d = exc.diagnostics[0]
        raise error("build.existing-registry", f"`{path}` is there but cannot be read, so a build would replace it "
                    f"(and drop any measurements in it) unseen: {d.message}", None,
                    "fix it (the error above says where), or move it away to build afresh", cls=UsageError) from None
    return old


def carried_table(old: Registry | None, kept: Registry) -> tuple[dict | None, int]:
    """What a rebuild keeps of the seqtune table of the registry ``old`` it replaces: the measurements (times and
    failures) of the kernels it builds again from the same cache key -- the same source, options and Triton; a
    kernel whose binary changed (or that is gone) is measured again by the next `fmha-dsl tune`.  ``(table or None,
    how many measurements were dropped)``."""
    if old is None or not old.seqtune:
        return None, 0
    new_keys = {e.identifier: _binaries(e.build) for e in kept}
    same = {e.identifier for e in old if _binaries(e.build) and new_keys.get(e.identifier) == _binaries(e.build)}
    classes, dropped = [], 0
    for c in old.seqtune.get("classes", []):
        points = []
        for p in c.get("points", []):
            times = {k: v for k, v in p.get("times_us", {}).items() if k in same}
            failed = {k: v for k, v in p.get("failed", {}).items() if k in same}
            dropped += len(p.get("times_us", {})) + len(p.get("failed", {})) - len(times) - len(failed)
            if times or failed:
                kept_point = dict(p, times_us=times)
                if "failed" in p:   # (written as the table had it, an empty one too: a rebuild is byte-stable)
                    kept_point["failed"] = failed
                points.append(kept_point)
        if points:
            classes.append(dict(c, points=points))
    return (dict(old.seqtune, classes=classes) if classes else None), dropped


def _binaries(build: dict | None) -> tuple:
    """The cache keys of what a kernel's timing ran: its binary and its companions' (split-KV's combine, the
    backward's stages); empty without a build."""
    b = build or {}
    if not b.get("cache_key"):
        return ()
    return (b["cache_key"], *sorted((role, v["cache_key"]) for role, v in b.items()
                                    if isinstance(v, dict) and v.get("cache_key")))


__all__ = ["build_with_triton", "compile_through_cache", "kernel_job", "companion_jobs", "build_record",
           "existing_registry", "carried_table"]
