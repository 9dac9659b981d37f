"""[cli] The ``fmha-dsl`` subcommands (``cmd_*``: ``args`` -> exit code); the parser and the error handling are in
:mod:`fmha_dsl.cli`."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict

from .cli_output import EXIT_FAIL, EXIT_OK, _err, _flush, _out, _write  # noqa: F401


def _load(args):
    from . import load

    return load(args.file)


def _report(args, keep_going: bool = False):
    ks = _load(args)
    t0 = time.perf_counter()
    rep = ks.expand_report(arch=args.arch, profile=args.profile, backend=getattr(args, "backend", None),
                           keep_going=keep_going)
    return ks, rep, time.perf_counter() - t0


def _print_notes(rep, fmt: str):
    if fmt == "json":
        return
    for d in rep.notes:
        _err(d.render())


def cmd_check(args) -> int:
    ks, rep, dt = _report(args)
    if not rep.kernels:  # what `build` refuses (build.empty), `check` does not call ok
        from .expand import nothing_to_build
        from .kernelset import _archs

        raise nothing_to_build(ks, rep, _archs(args.arch))
    reg = ks.registry(args.arch, args.profile, report=rep)
    if args.format == "json":
        _out(json.dumps({"ok": True, "kernels": len(reg), "by_arch": reg.statistics()["by_arch"],
                         "warnings": [d.to_dict() for d in rep.notes]}, sort_keys=True, indent=1))
        return EXIT_OK
    _print_notes(rep, args.format)
    per = ", ".join(f"{a}: {n}" for a, n in reg.statistics()["by_arch"].items())
    _out(f"ok: {ks.name}: {len(ks.declarations)} declarations, {len(reg)} kernels ({per})")
    return EXIT_OK


def cmd_list(args) -> int:
    ks, rep, _ = _report(args)
    _print_notes(rep, args.format)
    if args.format == "ck-names":
        names = sorted({k.name for k in rep.kernels})
        _out("\n".join(names) if names else "")
        return EXIT_OK
    reg = ks.registry(args.arch, args.profile, report=rep)
    if args.format == "json":
        _write(reg.to_json())
    elif args.format == "identifiers":
        _out("\n".join(e.identifier for e in reg))
    else:
        for e in reg:
            _out(f"{e.arch}  {e.name}")
    return EXIT_OK


def cmd_explain(args) -> int:
    """Counts even when a declaration fails: that is when they are wanted (its errors follow them)."""
    ks, rep, dt = _report(args, keep_going=True)
    status = EXIT_FAIL if rep.errors else EXIT_OK
    distinct = len({k.identifier for k in rep.kernels})   # (as check, list and build count: once each)
    twice = len(rep.kernels) - distinct
    if args.format == "json":
        _out(json.dumps({
            "ok": not rep.errors, "declarations": rep.per_decl, "dropped": dict(sorted(rep.dropped.items())),
            "dropped_by_declaration": rep.decl_dropped, "rules": rep.rule_text, "kernels": distinct,
            "warnings": [d.to_dict() for d in rep.notes], "diagnostics": [d.to_dict() for d in rep.errors]},
            sort_keys=True, indent=1))
        return status
    _print_notes(rep, args.format)
    _out(f"kernel set {ks.name}: {len(ks.declarations)} declarations, {distinct} kernels "
         + (f"({twice} named again by another declaration, counted once) " if twice else "")
         + f"(expanded in {dt * 1000:.0f} ms)")
    _out("")
    _out("kernels per declaration and arch, and the candidates each rule dropped from it:")
    for label, counts in rep.per_decl.items():
        cells = ", ".join(f"{a}: {n}" for a, n in counts.items()) or "(not for these archs)"
        _out(f"  {label:<32} {cells}")
        for rid, n in rep.decl_dropped.get(label, {}).items():
            _out(f"  {'':<32}   {n:>9}  dropped by {rid}")
    _out("")
    _out("candidates dropped by each rule (wildcard values the rules do not allow):")
    if not rep.dropped:
        _out("  (none)")
    for rid, n in sorted(rep.dropped.items(), key=lambda t: (-t[1], t[0])):
        _out(f"  {n:>9}  {rid:<40} e.g. {rep.rule_text.get(rid, '')}")
    if rep.errors:
        _flush()
        from .errors import RuleError

        _err("")
        _err(RuleError(rep.errors).render())
    return status


class _Progress:
    """`[ 12/96] 3.1 kernels/s, ETA 25 s, 0 failed, 40 cached` on stderr (redrawn on a terminal)."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self.last_pct = -1

    def __call__(self, done, total, failed, cached):
        el = time.perf_counter() - self.t0
        fresh = done - cached
        rate = fresh / el if el > 0 and fresh else 0.0
        eta = (total - done) / rate if rate else 0.0
        line = (f"[{done:>{len(str(total))}}/{total}] {rate:.1f} kernels/s, ETA {eta:.0f} s, "
                f"{failed} failed, {cached} cached")
        if self.tty:
            sys.stderr.write("\r" + line + ("\n" if done == total else ""))
            sys.stderr.flush()
        else:
            pct = (100 * done // total) // 10 if total else 10
            if pct != self.last_pct or done == total:
                self.last_pct = pct
                sys.stderr.write(line + "\n")


def cmd_build(args) -> int:
    from .build import build

    ks = _load(args)
    res = build(ks, args.output, arch=args.arch, profile=args.profile, backend=args.backend, jobs=args.jobs,
                progress=None if args.quiet else _Progress(), no_spills=args.no_spills)
    _print_notes(res.report, "text")
    for f in res.failures:
        _err(f"failed: {f['arch']} {f['name']}: {f['reason']}")
    if not res.written:  # (an error: said even with -q)
        why = ", ".join(f"{n} {what}" for n, what in ((len(res.failures), "failed"),
                                                      (res.spilled, "dropped for spills (--no-spills)")) if n)
        _err(f"no registry written: no kernel was kept ({why or 'none built'}); "
             + (f"{res.path} is as it was" if os.path.exists(res.path) else f"{res.path} was not made"))
        return EXIT_FAIL
    if not args.quiet:
        per = ", ".join(f"{a}: {n}" for a, n in res.by_arch.items())
        extra = (f"; compiled {res.compiled}, from cache {res.cached}, failed {len(res.failures)}"
                 if res.compiled or res.cached or res.failures else "")
        _out(f"wrote {res.path}: {res.total} kernels ({per}){extra}")
        if res.kept_table:
            _out(f"kept the seqtune table of the registry it replaced (`fmha-dsl tune {args.output}` measures what "
                 "is new)")
        if args.verbose:
            for rid, n in sorted(res.report.dropped.items(), key=lambda t: (-t[1], t[0])):
                _out(f"  dropped {n:>8} by {rid}")
    if res.dropped_points:   # (said even with -q: measurements are gone)
        _err(f"note: dropped {res.dropped_points} measurements of the registry it replaced (of kernels no longer in it "
             f"or built differently); `fmha-dsl tune {args.output}` measures again")
    return EXIT_FAIL if res.failures and not res.total else EXIT_OK


def cmd_report(args) -> int:
    from .report import write_report

    files = write_report(args.dir, args.output, png=args.png)
    if not args.quiet:
        for f in files:
            _out(f"wrote {f}")
    return EXIT_OK


def cmd_tune(args) -> int:
    import warnings

    from .runtime.tune import tune

    last = {"class": None}

    def progress(ev):
        if args.quiet:
            return
        c = ev["cls"]
        name = (("" if c["family"] == "fwd" else f"{c['family']} ") + f"{c['dtype']} d{c['hdim_q']}x{c['hdim_v']} "
                f"{c['mask']}" + (" lse" if c["lse"] else "")
                + (f" page {c['page_size']} {c['kv_lookup']} {c['kv_layout']}" if "page_size" in c else ""))
        if ev["event"] == "class":
            if ev.get("kernels") == 0:  # no kernel of this build serves the class
                if args.verbose:
                    _err(f"[{ev['class_index'] + 1}/{ev['classes']}] {name}: no kernels in this build, skipped")
                return
            _err(f"[{ev['class_index'] + 1}/{ev['classes']}] {name}: saved")
        elif ev["event"] == "failed":
            _err(f"  failed: {ev['kernel']} at {ev['point']}: {ev['why']}")
        elif args.verbose:
            _err(f"  {name} s={ev['point'][0]}x{ev['point'][1]} b={ev['point'][2]}: {ev['kernel']} "
                 f"{ev['us']:.1f} us")
        elif last["class"] != (ev["class_index"], ev["point_index"]):
            last["class"] = (ev["class_index"], ev["point_index"])
            _err(f"[{ev['class_index'] + 1}/{ev['classes']}] {name} point {ev['point_index'] + 1}/{ev['points']} "
                 f"(s={ev['point'][0]}x{ev['point'][1]} b={ev['point'][2]} h={ev['point'][3]}/{ev['point'][4]})")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = tune(args.dir, shapes=args.shapes, budget=args.budget, arch=args.arch, progress=progress,
                   warmup_ms=args.warmup, rep_ms=args.rep)
    for w in caught:
        _err(f"note: {w.message}")
    if res.note:
        _err(f"note: {res.note}")
    d = res.device
    _out(f"wrote {res.path}: measured {res.measured}, skipped {res.skipped} (already in the table), failed "
         f"{res.failed}; {res.classes} classes in {res.seconds:.0f} s on {d.get('name')} ({d.get('arch')}, driver "
         f"{d.get('driver')}, triton {d.get('triton')}, torch {d.get('torch')})"
         + ("; budget spent: run again to continue" if res.budget_spent else ""))
    return EXIT_OK


def cmd_precompile(args) -> int:
    """Compile what the first calls of every problem of a shape matrix may need into a cache folder (no GPU):
    :func:`fmha_dsl.precompile.precompile_report`."""
    from .arch import backend_archs
    from .cache import cache_base
    from .errors import UsageError, did_you_mean, error
    from .precompile import precompile_report
    from .runtime.tune_shapes import expand_shapes, load_shapes, problem_of

    archs = backend_archs("triton")
    if args.arch not in archs:
        one = "," not in args.arch and did_you_mean(args.arch, archs)   # (a list: one arch per run, not a spelling)
        raise error("usage.arch", f"--arch `{args.arch}`: the default path compiles for {', '.join(archs)}"
                    + (" (one arch per run)" if "," in args.arch else ""), None,
                    one or "name the GPU the kernels will run on, e.g. sm90 for an H100 or H200; run once per arch",
                    cls=UsageError)
    if args.cache_dir is not None and not args.cache_dir.strip():
        raise error("usage.output", "--cache-dir is empty", None, "name the folder to fill, e.g. --cache-dir deploy/",
                    cls=UsageError)
    _check_device(args.device, args.arch)
    doc = load_shapes(args.shapes)  # every input checked before the folder is made
    problems = [problem_of(cls, pt, args.arch) for cls, pts in expand_shapes(doc, args.shapes or "<shipped matrix>")
                for pt in pts]
    if not problems:  # (an empty list in the matrix: `classes: []`, `dtype: []`, `seqlens: []`)
        raise error("usage.shapes", f"the shape matrix `{args.shapes}` names no problem: one of its lists is empty",
                    None, "give each of classes, dtype and seqlens at least one value", cls=UsageError)
    folder = os.path.abspath(args.cache_dir if args.cache_dir is not None else cache_base())
    _check_writable(folder)
    t0 = time.perf_counter()
    done = precompile_report(problems, args.arch, jobs=args.jobs, cache_dir=folder, limit=args.limit,
                             device=args.device, progress=None if args.quiet else _Progress())
    for name, why in done.failed:
        _err(f"failed: {name}: {(why.strip().splitlines() or [''])[-1]}")
    none = sorted(set(done.no_kernel))
    for what in none[:8]:
        _err(f"note: the Triton rules allow no kernel on {args.arch} for {what}: such calls fail there")
    if len(none) > 8:
        _err(f"note: ... and {len(none) - 8} more problems of the matrix without a kernel on {args.arch}")
    if not args.quiet:
        _out(f"{_count(done.cached, 'kernel')} in the cache `{folder}` for {_count(len(problems), 'problem')} of "
             f"`{doc['name']}` on {args.arch} ({len(done.failed)} failed, {len(none)} without a kernel) in "
             f"{time.perf_counter() - t0:.0f} s; where they run, set FMHA_DSL_CACHE_DIR={folder}")
    return EXIT_FAIL if done.failed or (problems and len(done.no_kernel) == len(problems)) else EXIT_OK


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _check_device(device: str | None, arch: str) -> None:
    """``--device``: a shipped table's GPU name.  A name close to one (a typo, another case, a prefix) is an input
    error -- the kernels its table names would silently be left out -- a GPU of an arch without tables a note."""
    if device is None:
        return
    from .errors import UsageError, did_you_mean, error
    from .runtime.decisions import shipped_tables, use_shipped

    if not device.strip():
        raise error("usage.value", "--device is empty", None, "name the GPU as torch.cuda.get_device_name() does, "
                    "e.g. \"NVIDIA H100 80GB HBM3\", or leave --device out", cls=UsageError)
    if not use_shipped():
        _err("note: FMHA_DSL_TUNED_SHIPPED=0: no shipped table is read, --device selects nothing")
        return
    have = sorted(d for d in shipped_tables(arch) if isinstance(d, str))
    if device in have:
        return
    if not have:
        _err(f"note: no table ships for {arch}: only the candidates are compiled")
        return
    close = [d for d in have if d.lower() == device.lower() or d.lower().startswith(device.lower())]
    raise error("usage.value", f"--device `{device}`: no shipped table for it on {arch} (tables: {', '.join(have)})",
                None, (f"did you mean `{close[0]}`?" if close else did_you_mean(device, have))
                or "leave --device out to include the kernels of every table of the arch", cls=UsageError)


def _check_writable(folder: str) -> None:
    """A cache folder that cannot be made or written is an input error now, not warnings after the compile."""
    import tempfile

    from .errors import UsageError, error

    try:
        os.makedirs(os.path.join(folder, "kernels"), exist_ok=True)
        with tempfile.TemporaryFile(dir=os.path.join(folder, "kernels")):
            pass
    except OSError as exc:
        raise error("usage.output", f"cannot write the cache folder `{folder}`: `{exc.filename or folder}`: "
                    f"{exc.strerror or exc}", None, "pass --cache-dir a writable folder (or set FMHA_DSL_CACHE_DIR)",
                    cls=UsageError) from None


def cmd_fmt(args) -> int:
    from .fmt import format_source
    from .kernelset import resolve_set
    from .parse import read_source
    from .atomic_file import write_atomic

    status = EXIT_OK
    for given in args.files:
        path = resolve_set(given)
        if args.write and path != given:  # (a shipped set is read, never rewritten)
            from .errors import UsageError, error

            raise error("usage.write", f"`{given}` is a shipped kernel set: fmt --write rewrites files of yours",
                        None, f"print it with `fmha-dsl fmt {given}` (or copy it and format the copy)",
                        cls=UsageError)
        text = read_source(path)
        new = format_source(text, path)
        if args.check:
            if new != text:
                _err(f"{path}: would reformat")
                status = EXIT_FAIL
        elif args.write:
            if new != text:
                write_atomic(path, new)
        else:
            _write(new)
    return status


def cmd_schema(args) -> int:
    if args.what == "key":
        from .keys import json_schema

        _out(json.dumps(json_schema(), indent=1, sort_keys=True))
    elif args.what == "registry":
        from .registry import json_schema

        _out(json.dumps(json_schema(), indent=1, sort_keys=True))
    elif args.what == "setters":
        from . import vocab

        by = defaultdict(list)
        for s in vocab.SETTERS.values():
            by[s.block].append(s)
        for block in ("set", "signature", "algorithm"):
            _out(f"{block}:")
            for s in by[block]:
                _out(f"  {s.name}({', '.join(s.params)})  -- {s.doc}")
    elif args.what == "rules":
        from .rules import FAMILY_MODULES, TRITON_MODULES, family_rules
        from .rules.ck_common import HDIM_RULE, TILE_RULES

        seen = {}
        for backend, mods in (("ck", FAMILY_MODULES), ("triton", TRITON_MODULES)):
            for fam in mods:
                for r in family_rules(fam, backend).rules:
                    seen.setdefault(r.id, (fam, r))
        for r in (HDIM_RULE,) + TILE_RULES:
            seen.setdefault(r.id, ("all", r))
        for rid in sorted(seen):
            fam, r = seen[rid]
            kind = "filter" if r.filter else "rule"
            _out(f"{rid:<48} {kind:<6} reads {', '.join(r.deps)}")
    elif args.what == "grammar":
        from .parse import grammar_text

        _write(grammar_text())
    return EXIT_OK
