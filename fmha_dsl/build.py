"""[build] A kernel set -> a build directory.

Layout of a build directory (the compile backends of the next stage fill ``kernels/``)::

    DIR/registry.json              the registry (schema: `fmha-dsl schema registry`)
    DIR/kernels/<arch>/<name>.*    one binary per kernel (hsaco / cubin), named by its CK name
                                   and referenced from its registry entry's ``build`` object

Declarations are independent units of work: with ``jobs > 1`` a pool of forked worker processes
expands them and encodes their registry lines in parallel; the parent merges, de-duplicates (first
declaration wins), sorts and writes.  The output is byte-identical to the serial path.  With
``backend="none"`` only the registry is written (no compilation).
"""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import dataclass, field

from .atomic_file import write_atomic
from .errors import UsageError, error
from .expand import DeclResult, Report, expand_decl, merge, nothing_to_build
from .registry import (Entry, Registry, document_chunks, entry_line, registry_path, sort_key, stat_row,
                       statistics)
from .rules import FAMILY_MODULES

# rough relative costs per rule module, so the pool starts the big tasks first and the workers finish together
_MODULE_WEIGHT = {"ck_bwd": 10, "ck_fwd": 9, "ck_batch_prefill": 5, "ck_splitkv": 2}


@dataclass
class BuildResult:
    path: str
    total: int
    by_arch: dict
    report: Report        # drops, notes and per-declaration counts (kernels not kept)
    compiled: int = 0     # kernels compiled by this build
    cached: int = 0       # kernels taken from the cache
    failures: list = field(default_factory=list)   # [{name, arch, reason}] left out of the registry
    seconds: float = 0.0
    written: bool = True      # False: no kernel was kept, and no registry written (one already there is unchanged)
    spilled: int = 0          # kernels left out for spilling registers (--no-spills)
    kept_table: bool = False  # the seqtune table of the registry it replaced carried over
    dropped_points: int = 0   # measurements of that table not carried over (kernels gone, or built differently)


_WORKER_STATE: tuple | None = None   # (declarations, archs, profile, backend), set in each forked worker only


def _init_worker(state: tuple) -> None:
    global _WORKER_STATE
    _WORKER_STATE = state  # fork start method: handed over by inheritance, never pickled (rules hold lambdas)


def _worker_task(group: tuple[int, ...]):
    return _task(_WORKER_STATE, group)


def _task(state: tuple, group: tuple[int, ...]):
    """Expand some declarations and encode their registry lines."""
    decls, archs, profile, backend = state
    out = []
    for i in group:
        res: DeclResult = expand_decl(decls[i], archs, profile, backend)
        rows = []
        for k in res.report.kernels:
            e = Entry(None, k.name, k.source, sig=k.sig, alg=k.alg, arch=k.arch, ident=k.identifier)
            rows.append((sort_key(e), e.identifier, entry_line(e), stat_row(e)))
        res.report.kernels = []
        out.append((i, res, rows))
    return out


def _module(decl) -> str:
    fam = decl.fields.get("family")
    vals = fam.values if fam is not None and fam.values is not None else ("*",)
    return FAMILY_MODULES.get(vals[0], "*") if len(vals) == 1 else "*"


def _groups(decls) -> list[tuple[int, ...]]:
    """Declarations of one rule module form one task (they share its cached tables), big tasks first."""
    by: dict[str, list[int]] = {}
    for i, d in enumerate(decls):
        by.setdefault(_module(d), []).append(i)
    return sorted((tuple(v) for v in by.values()),
                  key=lambda g: (-_MODULE_WEIGHT.get(_module(decls[g[0]]), 1) * len(g), g))


def _run(decls, archs, profile, backend, jobs: int):
    state = (decls, archs, profile, backend)
    groups = _groups(decls)
    use_pool = jobs > 1 and len(groups) > 1 and "fork" in multiprocessing.get_all_start_methods()
    if not use_pool:
        return [r for g in groups for r in _task(state, g)]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(min(jobs, len(groups)), initializer=_init_worker, initargs=(state,)) as pool:
        return [r for part in pool.imap_unordered(_worker_task, groups, chunksize=1) for r in part]


def build(kernel_set, out_dir: str | os.PathLike, arch=None, profile=None, backend: str | None = None,
          jobs: int | None = None, progress=None, no_spills: bool = False, cache_dir: str | None = None
          ) -> BuildResult:
    """Expand ``kernel_set``, compile what its backend compiles, write ``out_dir/registry.json``.

    ``backend`` overrides the declarations' ``backend(...)``.  Triton kernels are compiled ahead of time
    (see :mod:`fmha_dsl.compile_triton`) through a content-addressed cache; CK kernels are listed only
    (C++ emission is a later stage).  ``progress(done, total, failed, cached)`` is called as kernels finish.
    """
    from .kernelset import _archs, _backend, _profile

    out = os.fspath(out_dir)
    if os.path.exists(out) and not os.path.isdir(out):
        raise error("usage.output", f"`{out}` exists and is not a directory", None,
                    "pass a directory with -o", cls=UsageError)
    try:  # before any work: an output folder that cannot be made fails now, not after the build
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise error("usage.output", f"cannot create the output folder `{out}`: {exc.strerror or exc}", None,
                    "pass a writable directory with -o", cls=UsageError) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise error("usage.output", f"the output folder `{out}` is not writable", None,
                    "pass a writable directory with -o, or make this one writable", cls=UsageError)
    archs, prof, backend = _archs(arch), _profile(profile), _backend(backend)
    decls = kernel_set.declarations
    jobs = max(1, jobs or os.cpu_count() or 1)
    if any((backend or d.backend) == "triton" for d in decls):
        from .build_triton import build_with_triton

        return BuildResult(**build_with_triton(kernel_set, out, archs, prof, backend, jobs, progress, no_spills,
                                               cache_dir))
    done = sorted(_run(decls, archs, prof, backend, jobs), key=lambda t: t[0])
    report = merge([res for _, res, _ in done], decls, archs, backend)
    seen, rows = set(), []
    for _, _, part in done:  # declaration order: the first declaration of a kernel wins
        for row in part:
            if row[1] not in seen:
                seen.add(row[1])
                rows.append(row)
    if not rows:
        raise nothing_to_build(kernel_set, report, archs)
    rows.sort(key=lambda r: r[0])
    stats = statistics(r[3] for r in rows)
    profiles = [prof] if prof else sorted({d.profile.values[0] for d in decls})
    sources = kernel_set.source_names()
    chunks = document_chunks(kernel_set.name, sorted(stats["by_arch"]), profiles, sources, stats, [r[2] for r in rows])
    from .build_triton import carried_table, existing_registry

    # (one this version cannot read stops the build; a CK registry, of no binaries, carries no measurement)
    _, dropped = carried_table(existing_registry(registry_path(out)), Registry())
    path = write_atomic(registry_path(out), chunks)
    return BuildResult(path, len(rows), stats["by_arch"], report, dropped_points=dropped)


__all__ = ["build", "BuildResult", "nothing_to_build"]
