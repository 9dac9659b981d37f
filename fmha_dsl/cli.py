"""[cli] ``fmha-dsl``: the only place that prints or exits.

Exit codes: 0 ok; 1 the input is well formed but fails (invalid combinations, empty declarations,
``fmt --check`` differences); 2 usage or input errors (bad arguments, unreadable or malformed files,
bad registry JSON); 70 internal error (a bug: the traceback is shown).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

EXIT_OK, EXIT_FAIL, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 70

EPILOG = """\
examples:
  fmha-dsl check kernelsets/ck_receipt0.fmha --arch gfx942
  fmha-dsl list kernelsets/ck_receipt0.fmha --arch gfx942 --format ck-names
  fmha-dsl list my.fmha --arch gfx950 --profile pytorch --format json
  fmha-dsl explain my.fmha --arch gfx950
  fmha-dsl build my.fmha --arch gfx942,gfx950 -o out/
  fmha-dsl fmt my.fmha --write
  fmha-dsl tune build/bench --budget 600
  fmha-dsl schema registry > registry.schema.json
  fmha-dsl schema rules
  fmha-dsl build bench_fwd --backend triton --arch sm90 -o build/bench
  fmha-dsl tune build/bench --budget 600          (on the GPU)
  fmha-dsl report build/bench -o report.html --png

exit codes: 0 ok, 1 failures (invalid combinations, build or dispatch failures, fmt --check diffs),
            2 usage or input errors, 70 internal error (fmha_dsl.errors: one class per fault)
"""


STDOUT_RULE = "output.stdout"


def _write(text: str) -> None:
    """Write to stdout; a stdout that refuses data (a full disk, /dev/full) is a usage error, not a bug."""
    try:
        sys.stdout.write(text)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise _stdout_error(exc) from None


def _flush() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise _stdout_error(exc) from None


def _stdout_error(exc: OSError):
    from .errors import UsageError, error

    return error(STDOUT_RULE, f"cannot write to standard output: {exc.strerror or exc}", None,
                 "redirect the output to a file on a disk with free space (or to a pipe that reads it)",
                 cls=UsageError)


def _out(text: str = "") -> None:
    _write(text + ("\n" if not text.endswith("\n") else ""))


def _err(text: str) -> None:
    sys.stderr.write(text.rstrip("\n") + "\n")


def _resolve_set(path: str) -> str:
    """A path, or the name of a shipped kernel set (``ck_receipt0``; a misspelt name gets a did-you-mean)."""
    if os.path.exists(path) or os.sep in path or "/" in path:
        return path
    from .kernelset import shipped

    return shipped(path)


def _load(args):
    from . import load

    return load(_resolve_set(args.file))


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
    if args.format == "json":
        _out(json.dumps({
            "ok": not rep.errors, "declarations": rep.per_decl, "dropped": dict(sorted(rep.dropped.items())),
            "dropped_by_declaration": rep.decl_dropped, "rules": rep.rule_text, "kernels": len(rep.kernels),
            "warnings": [d.to_dict() for d in rep.notes], "diagnostics": [d.to_dict() for d in rep.errors]},
            sort_keys=True, indent=1))
        return status
    _print_notes(rep, args.format)
    _out(f"kernel set {ks.name}: {len(ks.declarations)} declarations, {len(rep.kernels)} kernels "
         f"(expanded in {dt * 1000:.0f} ms)")
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
    if not args.quiet:
        per = ", ".join(f"{a}: {n}" for a, n in res.by_arch.items())
        extra = (f"; compiled {res.compiled}, from cache {res.cached}, failed {len(res.failures)}"
                 if res.compiled or res.cached or res.failures else "")
        _out(f"wrote {res.path}: {res.total} kernels ({per}){extra}")
        if args.verbose:
            for rid, n in sorted(res.report.dropped.items(), key=lambda t: (-t[1], t[0])):
                _out(f"  dropped {n:>8} by {rid}")
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
        name = f"{c['dtype']} d{c['hdim_q']}x{c['hdim_v']} {c['mask']}" + (" lse" if c["lse"] else "")
        if ev["event"] == "class":
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


def cmd_fmt(args) -> int:
    from .fmt import format_source
    from .parse import read_source
    from .registry import write_atomic

    status = EXIT_OK
    for path in args.files:
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


def _positive(text: str) -> int:
    """argparse type: an int >= 1 (argparse reports the error with the option's name)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return n


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(prog="fmha-dsl", description="Declare, check, expand and build FMHA kernel sets.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"fmha-dsl {__version__}")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks for every error")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    def common(sp, formats):
        sp.add_argument("file", help=".fmha file (or the name of a shipped set, e.g. ck_receipt0)")
        sp.add_argument("--arch", help="comma-separated archs (default: the set's arch list)")
        sp.add_argument("--profile", help="receipt profile name or number (overrides the set's)")
        if sp.prog.split()[-1] != "build":
            sp.add_argument("--backend", choices=["ck", "triton"], default=None,
                            help="whose rules decide what exists (default: the set's backend(...), else ck)")
        sp.add_argument("--format", choices=formats, default=formats[0])

    sp = sub.add_parser("check", help="parse, validate and expand; report errors",
                        epilog="example: fmha-dsl check my.fmha --arch gfx950")
    common(sp, ["text", "json"])
    sp.set_defaults(fn=cmd_check)
    sp = sub.add_parser("list", help="list expanded kernels",
                        epilog="example: fmha-dsl list ck_receipt0 --arch gfx942 --format ck-names")
    common(sp, ["text", "ck-names", "identifiers", "json"])
    sp.set_defaults(fn=cmd_list)
    sp = sub.add_parser("explain", help="per-declaration counts and what each rule dropped",
                        epilog="example: fmha-dsl explain my.fmha --arch gfx950")
    common(sp, ["text", "json"])
    sp.set_defaults(fn=cmd_explain)
    sp = sub.add_parser("build", help="expand and write DIR/registry.json",
                        epilog="example: fmha-dsl build my.fmha --arch gfx942,gfx950 -o out/")
    common(sp, ["text"])
    sp.add_argument("-o", "--output", default="fmha-build", help="build directory (default: ./fmha-build)")
    sp.add_argument("--backend", default=None, choices=["ck", "triton"],
                    help="rules and compiler (default: each declaration's backend(...), else ck). triton compiles "
                         "every kernel ahead of time (hsaco for gfx*, cubin for sm*); ck writes the registry only")
    sp.add_argument("-j", "--jobs", type=_positive, default=None, help="worker processes (default: CPU count)")
    sp.add_argument("--no-spills", action="store_true", help="leave out kernels that spill registers")
    sp.add_argument("-q", "--quiet", action="store_true")
    sp.add_argument("-v", "--verbose", action="store_true", help="also say what each rule dropped")
    sp.set_defaults(fn=cmd_build)
    sp = sub.add_parser("tune", help="time every kernel of a build directory on the GPU into its seqtune table",
                        epilog="example: fmha-dsl tune build/bench --budget 600")
    sp.add_argument("dir", help="build directory (with registry.json and the compiled kernels)")
    sp.add_argument("--shapes", default=None, help="shape matrix, JSON or YAML (default: the shipped matrix)")
    sp.add_argument("--budget", type=float, default=None, help="stop after this many seconds (resumable)")
    sp.add_argument("--arch", default=None, help="registry arch to tune (default: the GPU's)")
    sp.add_argument("--warmup", type=float, default=10.0, help="warm-up per timing, ms (default 10)")
    sp.add_argument("--rep", type=float, default=40.0, help="repeats per timing, ms (default 40)")
    sp.add_argument("-q", "--quiet", action="store_true")
    sp.add_argument("-v", "--verbose", action="store_true", help="print every timing")
    sp.set_defaults(fn=cmd_tune)
    sp = sub.add_parser("report", help="HTML (and PNG) charts of a tuned build directory's seqtune table",
                        epilog="example: fmha-dsl report build/bench -o report.html --png")
    sp.add_argument("dir", help="build directory (or its registry.json) after `fmha-dsl tune`")
    sp.add_argument("-o", "--output", default="report.html", help="report.html, or report.png for the image only")
    sp.add_argument("--png", action="store_true", help="also write the charts as <output>.png")
    sp.add_argument("-q", "--quiet", action="store_true")
    sp.set_defaults(fn=cmd_report)
    sp = sub.add_parser("fmt", help="format .fmha files canonically",
                        epilog="example: fmha-dsl fmt --check kernelsets/*.fmha")
    sp.add_argument("files", nargs="+")
    g = sp.add_mutually_exclusive_group()
    g.add_argument("--check", action="store_true", help="exit 1 if a file would change")
    g.add_argument("--write", action="store_true", help="rewrite files in place")
    sp.set_defaults(fn=cmd_fmt)
    sp = sub.add_parser("schema", help="print a JSON schema, the setter list or the grammar",
                        epilog="example: fmha-dsl schema registry")
    sp.add_argument("what", choices=["key", "registry", "setters", "rules", "grammar"])
    sp.set_defaults(fn=cmd_schema)
    return p


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush of what is left has nowhere to fail."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (captured by a test)
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass


def main(argv=None) -> int:
    from .errors import FmhaError, InternalError

    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "fn", None):
        parser.print_help()
        return EXIT_INPUT
    try:
        status = args.fn(args)
        _flush()  # here, not at exit: a stdout that refuses data is reported like any other error
        return status
    except FmhaError as exc:
        if args.debug:
            raise
        fmt = getattr(args, "format", "text")
        if exc.rule == STDOUT_RULE:
            _silence_stdout()
            fmt = "text"
        if fmt == "json":
            doc = {"ok": False, "fault": exc.fault, "diagnostics": [d.to_dict() for d in exc.diagnostics]}
            _out(json.dumps(doc, sort_keys=True, indent=1))
        else:
            _err(exc.render())
            n = len(exc.diagnostics)
            if n > 1:
                _err(f"{n} errors")
        if isinstance(exc, InternalError):
            _err("fmha-dsl: internal error (this is a bug; please report it with the input that caused it)")
        return exc.exit_code  # the class says whose fault it is: 2 input, 1 failures, 70 internal (errors.py)
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_OK
    except Exception:  # a bug in fmha-dsl, not in the input
        import traceback

        traceback.print_exc()
        _err("fmha-dsl: internal error (this is a bug; please report it with the input that caused it)")
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
