"""[cli] ``fmha-dsl``: the parser, the exit codes and the error handling (the subcommands: :mod:`.cli_commands`;
writing: :mod:`.cli_output`).  The ``cli*`` modules are the only ones that print or exit.

Exit codes: 0 ok; 1 the input is well formed but fails (invalid combinations, empty declarations,
``fmt --check`` differences); 2 usage or input errors (bad arguments, unreadable or malformed files,
bad registry JSON); 70 internal error (a bug: the traceback is shown).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from .cli_commands import (cmd_build, cmd_check, cmd_explain, cmd_fmt, cmd_list, cmd_precompile,  # noqa: F401
                           cmd_report, cmd_schema, cmd_tune)
from .cli_output import EXIT_INPUT, EXIT_INTERNAL, EXIT_OK, STDOUT_RULE, _err, _flush, _out  # noqa: F401

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
  fmha-dsl precompile --arch sm90 --shapes shapes.json --cache-dir deploy/ --limit 4

exit codes: 0 ok, 1 failures (invalid combinations, build or dispatch failures, fmt --check diffs),
            2 usage or input errors, 70 internal error (fmha_dsl.errors: one class per fault)
"""


def _positive(text: str) -> int:
    """argparse type: an int >= 1 (argparse reports the error with the option's name)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return n


def _number(zero_ok: bool):
    """argparse type: a finite number > 0 (``>= 0`` with ``zero_ok``): ``--budget nan`` never stopped, ``--rep 0``
    timed nothing."""
    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            x = math.nan
        if not (math.isfinite(x) and (x >= 0 if zero_ok else x > 0)):
            raise argparse.ArgumentTypeError(f"must be a finite number {'>=' if zero_ok else '>'} 0, got {text!r}")
        return x
    return parse


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
    sp.add_argument("--budget", type=_number(False), default=None, help="stop after this many seconds (resumable)")
    sp.add_argument("--arch", default=None, help="registry arch to tune (default: the GPU's)")
    sp.add_argument("--warmup", type=_number(True), default=10.0, help="warm-up per timing, ms (default 10)")
    sp.add_argument("--rep", type=_number(False), default=40.0, help="repeats per timing, ms (default 40)")
    sp.add_argument("-q", "--quiet", action="store_true")
    sp.add_argument("-v", "--verbose", action="store_true", help="print every timing")
    sp.set_defaults(fn=cmd_tune)
    sp = sub.add_parser("precompile", help="compile the default path's candidate kernels for a shape matrix into a "
                        "kernel cache (no GPU needed), for a deployment",
                        epilog="example: fmha-dsl precompile --shapes shapes.json --arch sm90 --cache-dir deploy/")
    sp.add_argument("--shapes", default=None, help="shape matrix, JSON or YAML, in `fmha-dsl tune`'s format "
                    "(default: the shipped matrix)")
    sp.add_argument("--arch", required=True, help="the deployment's GPU arch (e.g. sm90, sm80, gfx942)")
    sp.add_argument("--cache-dir", default=None, help="cache folder to fill (default: FMHA_DSL_CACHE_DIR, else "
                    "the user's cache); set FMHA_DSL_CACHE_DIR to it where the kernels run")
    sp.add_argument("--limit", type=_positive, default=None, help="per problem, only the N candidates the cost "
                    "model ranks highest (default: every candidate first use may time); the kernels a shipped "
                    "table names for the problem's class are compiled either way")
    sp.add_argument("--device", default=None, help="the deployment GPU's name as torch reports it (e.g. \"NVIDIA "
                    "H100 80GB HBM3\"): only its shipped table (default: every shipped table of --arch)")
    sp.add_argument("-j", "--jobs", type=_positive, default=None, help="worker processes (default: CPU count)")
    sp.add_argument("-q", "--quiet", action="store_true")
    sp.set_defaults(fn=cmd_precompile)
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
    for sp in sub.choices.values():  # `fmha-dsl check F --debug` as well as `fmha-dsl --debug check F`
        sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
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
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "fn", None):
        parser.print_help()
        return EXIT_INPUT
    import warnings

    with warnings.catch_warnings():  # (restores the caller's warning display when the command returns)
        if not args.debug:  # the library's warnings as the CLI's own lines, not Python's `file:line: Warning` form
            warnings.showwarning = lambda message, *a, **k: _err(f"warning: {message}")
        return _run(args)


def _run(args) -> int:
    """Run the command ``args`` names; its errors become messages and the exit code."""
    from .errors import FmhaError, InternalError

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
