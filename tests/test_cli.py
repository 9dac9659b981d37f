"""The command line: exit codes, formats, help, output files."""

import json
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
GOOD = """kernel_set g { arch(gfx942)
  kernel k { signature { family(fwd) dtype(fp16) hdim(128) mode(*) } algorithm { pipeline(*) tile(*) padding(*) } } }
"""


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "fmha_dsl.cli", *args], capture_output=True, text=True,
                          cwd=cwd or HERE, timeout=300)


def test_help_has_examples():
    out = cli("--help")
    assert out.returncode == 0 and "examples:" in out.stdout and "exit codes" in out.stdout
    for cmd in ("check", "list", "explain", "build", "fmt", "schema", "tune", "report", "precompile"):
        sub = cli(cmd, "--help")
        assert sub.returncode == 0 and "example" in sub.stdout


def test_check_ok_and_json(write):
    p = write("g.fmha", GOOD)
    out = cli("check", p)
    assert out.returncode == 0 and out.stdout.startswith("ok: g:")
    out = cli("check", p, "--format", "json")
    doc = json.loads(out.stdout)
    assert doc["ok"] and doc["kernels"] > 0


def test_parse_error_exit_2_with_caret_no_traceback(write):
    p = write("bad.fmha", "kernel_set a { kernel { signature { dtype(bf61) } } }")
    out = cli("check", p)
    assert out.returncode == 2
    assert f"{p}:1:43: error[value.unknown]" in out.stderr
    assert "^^^^" in out.stderr and "did you mean `bf16`?" in out.stderr
    assert "Traceback" not in out.stderr


def test_rule_error_exit_1(write):
    p = write("r.fmha", "kernel_set a { arch(gfx942) kernel { signature { family(fwd) dtype(fp16) hdim(128) "
                        "logits(true) bias(bias) } algorithm { pipeline(*) tile(*) padding(*) } } }")
    out = cli("check", p)
    assert out.returncode == 1 and "error[" in out.stderr and "Traceback" not in out.stderr
    out = cli("check", p, "--format", "json")
    doc = json.loads(out.stdout)
    assert out.returncode == 1 and doc["ok"] is False and doc["diagnostics"][0]["line"] == 1


def test_usage_errors_exit_2(write):
    p = write("g.fmha", GOOD)
    assert cli("list", p, "--arch", "gfx951").returncode == 2
    assert cli("list", p, "--format", "yaml").returncode == 2
    assert cli("check", "/nope.fmha").returncode == 2
    assert cli().returncode == 2


def test_list_formats(write):
    p = write("g.fmha", GOOD)
    names = cli("list", p, "--format", "ck-names").stdout.split()
    assert names == sorted(names) and all(n.startswith("fmha_fwd_d128_fp16_") for n in names)
    idents = cli("list", p, "--format", "identifiers").stdout.split()
    assert len(idents) == len(names) == len(set(idents))
    doc = json.loads(cli("list", p, "--format", "json").stdout)
    assert doc["metadata"]["total_kernels"] == len(names)


def test_explain_counts_drops(write):
    p = write("g.fmha", GOOD)
    out = cli("explain", p)
    assert out.returncode == 0 and "dropped by each rule" in out.stdout
    doc = json.loads(cli("explain", p, "--format", "json").stdout)
    assert doc["declarations"]["k"]["gfx942"] == doc["kernels"] > 0
    assert sum(doc["dropped"].values()) > 0


def test_build_writes_registry_from_any_directory(write, tmp_path):
    p = write("g.fmha", GOOD)
    out = cli("build", p, "-o", str(tmp_path / "out"), cwd="/")
    assert out.returncode == 0, out.stderr
    reg = json.loads((tmp_path / "out" / "registry.json").read_text())
    assert reg["metadata"]["total_kernels"] > 0
    out = cli("build", "ck_receipt0", "--arch", "gfx942", "-o", str(tmp_path / "ck"), "-q", cwd="/")
    assert out.returncode == 0 and out.stdout == ""


def test_fmt_check_and_write(write):
    p = write("u.fmha", "kernel_set a{kernel{signature{family(fwd)}}}")
    assert cli("fmt", "--check", p).returncode == 1
    assert cli("fmt", "--write", p).returncode == 0
    assert cli("fmt", "--check", p).returncode == 0
    assert open(p).read().startswith("kernel_set a {\n")


@pytest.mark.parametrize("what", ["key", "registry", "setters", "grammar"])
def test_schema(what):
    out = cli("schema", what)
    assert out.returncode == 0 and out.stdout
    if what in ("key", "registry"):
        json.loads(out.stdout)


def test_schema_rules_lists_both_backends_rules():
    from fmha_dsl.rules import family_rules

    listed = {line.split()[0] for line in cli("schema", "rules").stdout.splitlines() if line.strip()}
    for fam, backend in (("fwd", "ck"), ("bwd_dq_dk_dv", "ck"), ("fwd", "triton"), ("fwd_splitkv", "triton")):
        assert {r.id for r in family_rules(fam, backend).rules} <= listed, (fam, backend)
    assert {"triton.tma", "triton.tma-vlayout"} <= listed


def test_unsupported_family_is_a_warning_not_a_crash():
    out = cli("list", "ck_receipt0", "--arch", "gfx1100", "--format", "ck-names")
    assert out.returncode == 0
    assert "bwd_dq_dk_dv is not supported on gfx1100" in out.stderr
    assert "Traceback" not in out.stderr


def test_parallel_build_equals_serial_and_registry(tmp_path):
    """-j 2 (forked workers) writes the same bytes as -j 1 and as Registry.to_json."""
    import fmha_dsl

    outs = []
    for j in ("1", "2"):
        out = cli("build", "ck_receipt0", "--arch", "gfx942", "-o", str(tmp_path / j), "-q", "-j", j)
        assert out.returncode == 0, out.stderr
        outs.append((tmp_path / j / "registry.json").read_bytes())
    assert outs[0] == outs[1]
    ks = fmha_dsl.load(fmha_dsl.shipped("ck_receipt0"))
    assert ks.registry("gfx942").to_json().encode() == outs[0]


def test_jobs_must_be_positive():
    for bad in ("0", "-3", "x"):
        r = cli("build", "ck_receipt0", "--arch", "gfx942", "-o", "/tmp/never-written", "-j", bad)
        assert r.returncode == 2 and "-j/--jobs: must be a whole number >= 1" in r.stderr


# ---- defects found trying the CLI as a new user ------------------------------------------------------------
REPO = os.path.dirname(HERE)
EMPTY_BUILD = """kernel_set e { arch(gfx942, gfx1100)
  kernel k { signature { family(bwd_dq_dk_dv) dtype(fp16) hdim(128) } algorithm { pipeline(*) tile(*) padding(*) } }
}
"""


def run_main(capsys, *args):
    """The CLI in this process (so a test can patch os-level calls); (exit code, stdout, stderr)."""
    from fmha_dsl import cli as cli_module

    rc = cli_module.main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _failing_replace(errno_value, strerror):
    real = os.replace

    def fake(src, dst, *a, **kw):
        if str(dst).endswith((".fmha", "registry.json")):
            raise OSError(errno_value, strerror)
        return real(src, dst, *a, **kw)

    return fake


def test_a_full_disk_is_an_input_error_naming_the_path(write, tmp_path, monkeypatch, capsys):
    import errno

    p = write("g.fmha", GOOD)
    out = tmp_path / "out"
    monkeypatch.setattr(os, "replace", _failing_replace(errno.ENOSPC, "No space left on device"))
    rc, _, err = run_main(capsys, "build", p, "-o", str(out), "-q")
    assert rc == 2 and "Traceback" not in err
    assert f"cannot write `{out / 'registry.json'}`: No space left on device" in err and "disk is full" in err
    assert os.listdir(out) == []  # no registry, no temporary file left


def test_fmt_write_into_a_read_only_folder_is_an_input_error(write, monkeypatch, capsys):
    import errno

    p = write("u.fmha", "kernel_set a{kernel{signature{family(fwd)}}}")
    monkeypatch.setattr(os, "replace", _failing_replace(errno.EACCES, "Permission denied"))  # root writes anyway
    rc, _, err = run_main(capsys, "fmt", "--write", p)
    assert rc == 2 and f"cannot write `{p}`: Permission denied" in err and "writable" in err
    assert open(p).read() == "kernel_set a{kernel{signature{family(fwd)}}}"
    assert sorted(os.listdir(os.path.dirname(p))) == ["u.fmha"]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only folders")
def test_build_into_a_read_only_folder(write, tmp_path):
    p = write("g.fmha", GOOD)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        r = cli("build", p, "-o", str(ro))
        assert r.returncode == 2 and str(ro) in r.stderr and "Traceback" not in r.stderr
        r = cli("fmt", "--write", p, cwd=str(ro))
        assert r.returncode == 0  # p is elsewhere: nothing to do with the read-only cwd
    finally:
        ro.chmod(0o755)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_stdout_on_a_full_disk(write):
    p = write("g.fmha", GOOD)
    for args in (("list", p), ("list", p, "--format", "json"), ("schema", "grammar"), ("check", p)):
        with open("/dev/full", "w") as full:
            r = subprocess.run([sys.executable, "-m", "fmha_dsl.cli", *args], stdout=full, stderr=subprocess.PIPE,
                               text=True, cwd=HERE, timeout=300)
        assert r.returncode == 2, (args, r.stderr)
        assert "cannot write to standard output: No space left on device" in r.stderr
        assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr


@pytest.mark.parametrize("flag,value,says", [("--budget", "nan", "> 0"), ("--budget", "-5", "> 0"),
                                             ("--warmup", "-1", ">= 0"), ("--rep", "0", "> 0"),
                                             ("--rep", "inf", "> 0")])
def test_tune_takes_finite_positive_times(tmp_path, flag, value, says):
    """`--budget nan` never stopped, `--rep 0` timed nothing: argparse refuses them, naming the flag (exit 2)."""
    r = cli("tune", str(tmp_path), flag, value)
    assert r.returncode == 2 and f"argument {flag}: must be a finite number {says}, got '{value}'" in r.stderr


def test_the_librarys_warnings_are_cli_lines(tmp_path):
    """An unwritable kernel cache warns as `warning: ...`, not Python's `file:line: UserWarning` with a source line."""
    pytest.importorskip("triton")
    env = dict(os.environ, FMHA_DSL_CACHE_DIR="/proc/fmha-dsl-no-such-dir")
    src = tmp_path / "one.fmha"
    src.write_text("kernel_set one { backend(triton) arch(sm90)\n  kernel k { signature { family(bwd_dot_do_o) "
                   "dtype(bf16) hdim(64) } } }\n")
    r = subprocess.run([sys.executable, "-m", "fmha_dsl.cli", "build", str(src), "-o", str(tmp_path / "o"), "-q"],
                       capture_output=True, text=True, cwd=HERE, env=env, timeout=900)
    assert r.returncode == 0, r.stderr
    assert "warning: the kernel cache `/proc/fmha-dsl-no-such-dir" in r.stderr and "UserWarning" not in r.stderr


def test_explain_counts_a_kernel_two_declarations_name_once(write):
    """`kernel y` (mask(*)) names x's kernels again: check/list/build count 4; explain said 6."""
    p = write("d.fmha", "kernel_set a {\n    arch(gfx942)\n"
                        "    kernel x { signature { family(fwd) dtype(fp16) hdim(128) } }\n"
                        "    kernel y { signature { family(fwd) dtype(fp16) hdim(128) mask(*) } }\n}\n")
    assert "4 kernels (gfx942: 4)" in cli("check", p).stdout
    text = cli("explain", p).stdout
    assert "2 declarations, 4 kernels (2 named again by another declaration, counted once)" in text
    assert json.loads(cli("explain", p, "--format", "json").stdout)["kernels"] == 4


def test_fmt_reads_a_shipped_set_by_name_and_never_rewrites_it():
    r = cli("fmt", "serving")
    assert r.returncode == 0 and r.stdout.startswith("# Serving kernels")
    assert cli("fmt", "--check", "serving").returncode == 0
    r = cli("fmt", "--write", "serving")
    assert r.returncode == 2 and "`serving` is a shipped kernel set" in r.stderr and "fmha-dsl fmt serving" in r.stderr


def test_debug_goes_before_or_after_the_command():
    """`--debug` shows the traceback (the error raised), wherever it is written; without it, the located error."""
    for args in (("--debug", "check", "no-such-set"), ("check", "no-such-set", "--debug")):
        r = cli(*args)
        assert "Traceback" in r.stderr and "ParseError" in r.stderr, args
    r = cli("check", "no-such-set")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_check_refuses_what_build_refuses_as_empty(write):
    """A set of no kernel (here: a family the Triton backend does not implement) was `ok: ... 0 kernels` in check and
    build.empty in build; both now say build.empty (exit 1)."""
    p = write("c.fmha", "kernel_set c {\n backend(triton)\n arch(*)\n"
                        " kernel k { signature { family(fwd_splitkv_combine) dtype(fp16) hdim(128) } }\n}\n")
    for cmd in ("check", "build"):
        r = cli(cmd, p, *(("-o", os.path.join(os.path.dirname(p), "o")) if cmd == "build" else ()))
        assert r.returncode == 1 and "error[build.empty]" in r.stderr and "has no triton kernels" in r.stderr, cmd


def test_an_empty_arch_is_an_error_not_every_target(write):
    """`--arch "$ARCH"` with ARCH unset: exit 2, where it used to build for every target the set declares."""
    p = write("g.fmha", GOOD)
    for value in ("", ",", " , "):
        r = cli("check", p, "--arch", value)
        assert r.returncode == 2 and "arch names no target" in r.stderr and "`*` for every target" in r.stderr
    assert cli("check", p, "--arch", "*").returncode == 0
    r = cli("tune", str(HERE), "--arch", "")   # (before torch or the GPU are looked for)
    assert r.returncode == 2 and "--arch names no arch" in r.stderr


def test_a_closed_stdout_is_a_usage_error(write):
    """Started with stdout closed (`fmha-dsl check f >&-`): Python leaves sys.stdout None (was an AttributeError)."""
    p = write("g.fmha", GOOD)
    for args in (("check", p), ("list", p, "--format", "json")):
        r = subprocess.run([sys.executable, "-m", "fmha_dsl.cli", *args], stderr=subprocess.PIPE, text=True, cwd=HERE,
                           timeout=300, preexec_fn=lambda: os.close(1))
        assert r.returncode == 2, (args, r.stderr)
        assert "cannot write to standard output: it is closed" in r.stderr and "Traceback" not in r.stderr


def test_tune_without_a_gpu_is_a_usage_error_naming_the_flag(tmp_path, monkeypatch, capsys):
    """A CPU-only torch (or no GPU): exit 2 and a hint about --arch, not an AssertionError from torch.cuda."""
    import types

    pytest.importorskip("triton")
    torch = types.ModuleType("torch")
    torch.__version__ = "0.0+cpu"
    torch.cuda = types.SimpleNamespace(is_available=lambda: False)
    torch.version = types.SimpleNamespace(cuda=None, hip=None)
    monkeypatch.setitem(sys.modules, "torch", torch)
    import fmha_dsl

    fmha_dsl.loads("kernel_set t { backend(triton) arch(sm90) kernel k { signature { family(fwd) dtype(fp16) hdim(64) "
                   "mask(no) } } }").registry(arch="sm90").save(tmp_path / "registry.json")   # (read first)
    for args in (("--arch", "sm90"), ()):
        rc, _, err = run_main(capsys, "tune", str(tmp_path), *args)
        assert rc == 2 and "Traceback" not in err
        assert "error[usage.no-gpu]" in err and "CPU-only" in err and "--arch" in err and "arch=" not in err


def test_fmt_write_follows_symlinks_and_keeps_the_mode(tmp_path):
    target = tmp_path / "real.fmha"
    target.write_text("kernel_set a{kernel{signature{family(fwd)}}}")
    target.chmod(0o640)
    link = tmp_path / "link.fmha"
    link.symlink_to(target)
    assert cli("fmt", "--write", str(link)).returncode == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text().startswith("kernel_set a {\n")
    assert (target.stat().st_mode & 0o777) == 0o640
    assert sorted(os.listdir(tmp_path)) == ["link.fmha", "real.fmha"]


def test_shipped_sets_are_found_from_a_source_checkout():
    """`python bench/bench_expand.py` / `python -m fmha_dsl.cli` from the repository root import the checkout,
    whose kernelsets/ and grammar/ are top-level folders (the wheel maps them into the package)."""
    env = dict(os.environ, PYTHONPATH=REPO)
    code = ("import fmha_dsl, os; print(os.path.dirname(os.path.dirname(fmha_dsl.__file__))); "
            "print(fmha_dsl.shipped('ck_receipt0'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    root, path = r.stdout.split()
    assert os.path.samefile(root, REPO) and os.path.samefile(path, os.path.join(REPO, "kernelsets", "ck_receipt0.fmha"))
    r = subprocess.run([sys.executable, "-m", "fmha_dsl.cli", "check", "seqtune_fwd"], capture_output=True,
                       text=True, cwd=REPO, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("ok: seqtune_fwd:"), r.stderr


@pytest.mark.parametrize("text", ["", "# only a comment\n"])
def test_a_file_without_a_kernel_set_is_a_located_input_error(write, text):
    p = write("none.fmha", text)
    r = cli("check", p)
    assert r.returncode == 2 and f"{p}:1:1: error[set.none]" in r.stderr
    doc = json.loads(cli("check", p, "--format", "json").stdout)["diagnostics"][0]
    assert (doc["path"], doc["line"], doc["column"]) == (p, 1, 1)


def test_explain_counts_what_emptied_a_declaration(write):
    p = write("z.fmha", "kernel_set z { arch(gfx942)\n  kernel k { signature { family(fwd) dtype(fp16) hdim(128) } "
                        "algorithm { pipeline(*) tile(*) padding(*) } where tile_m0 > 100000 }\n}\n")
    r = cli("check", p)
    assert r.returncode == 1 and "decl.empty" in r.stderr and f"`fmha-dsl explain {os.path.basename(p)}`" in r.stderr
    r = cli("explain", p)
    assert r.returncode == 1 and "decl.empty" in r.stderr
    assert "k                                gfx942: 0" in r.stdout
    assert "dropped by where#0" in r.stdout and "dropped by ck.fwd.hdim-tile" in r.stdout
    doc = json.loads(cli("explain", p, "--format", "json").stdout)
    assert doc["ok"] is False and doc["diagnostics"][0]["rule"] == "decl.empty"
    assert doc["declarations"]["k"] == {"gfx942": 0} and doc["dropped_by_declaration"]["k"]["where#0"] > 0


NO_ARCH = "kernel_set n { kernel k { signature { family(fwd) dtype(fp16) hdim(128) } } }"
TRITON_BWD = ("kernel_set t { backend(triton) arch(sm90)\n"
              "  kernel k { signature { family(fwd_splitkv_combine) dtype(bf16) hdim(128) } }\n}\n")
HINTS = {  # case: (file text or None, arguments ({} = the file), wanted in stderr, unwanted in stderr)
    "triton-backward": (TRITON_BWD, ("check", "{}"),
                        ["the triton backend implements fwd, fwd_pagedkv, fwd_splitkv, fwd_appendkv, batch_prefill, "
                         "bwd_dot_do_o, bwd_dq_dk_dv, bwd_convert_dq only"], ["pick an arch"]),
    "shipped-name": (None, ("check", "ck_receipt"), ["did you mean `ck_receipt0`?"], ["relative includes"]),
    "report-unbuilt": (None, ("report", "{dir}"), ["no registry.json", "build first"], ["run fmha-dsl tune"]),
    "where-equals": ('kernel_set w { kernel { signature { family(fwd) } where pipeline = "qr" } }', ("check", "{}"),
                     ["write `==`"], []),
    "arch-case-flag": (GOOD, ("check", "{}", "--arch", "GFX942"), ["did you mean `gfx942`?"], []),
    "arch-case-file": (GOOD.replace("gfx942", "SM90"), ("check", "{}"), ["did you mean `sm90`?"], []),
    "arch-flag-no-arch-set": (NO_ARCH, ("check", "{}", "--arch", "sm90"),
                              ["declares no arch, so it is for gfx942 only",
                               "--arch only picks among the archs a set declares", "add `backend(triton)` too"], []),
}


@pytest.mark.parametrize("case", sorted(HINTS))
def test_hints_point_the_right_way(case, write, tmp_path):
    text, args, wanted, unwanted = HINTS[case]
    p = write("h.fmha", text) if text is not None else None
    r = cli(*[a.format(p, dir=tmp_path) for a in args])
    assert r.returncode in (1, 2) and "Traceback" not in r.stderr, r.stderr
    for w in wanted:
        assert w in r.stderr, r.stderr
    for u in unwanted:
        assert u not in r.stderr, r.stderr


def test_every_bad_arch_is_reported(write):
    r = cli("check", write("a.fmha", GOOD.replace("arch(gfx942)", "arch(gfx924, sm_90)")))
    assert r.returncode == 2 and "unknown arch `gfx924`" in r.stderr and "unknown arch `sm_90`" in r.stderr
    assert "2 errors" in r.stderr


def test_a_build_of_no_kernel_fails_and_writes_nothing(write, tmp_path):
    p = write("e.fmha", EMPTY_BUILD)
    r = cli("build", p, "--arch", "gfx1100", "-o", str(tmp_path / "out"))
    assert r.returncode == 1 and "error[build.empty]" in r.stderr and "no backward kernels for gfx11" in r.stderr
    assert not (tmp_path / "out" / "registry.json").exists()


TINY_SHAPES = {"classes": [{"dtype": "bf16", "hdim": 64, "mask": "causal", "nhead_q": 4, "nhead_k": 4,
                            "seqlens": [1024], "batch": [2]}]}


def test_precompile_fills_the_cache_that_first_use_then_only_loads(tmp_path, monkeypatch):
    """`fmha-dsl precompile` compiles the candidates first use would time for each problem of a shape matrix (here
    the cost model's best one) into --cache-dir, on a machine without a GPU; a first-use builder pointed at that folder
    then finds them with compiling forbidden (cache_only), as FMHA_DSL_NO_BUILD=1 would on the deployment."""
    pytest.importorskip("triton")
    from fmha_dsl.first_use import Builder
    from fmha_dsl.runtime.tune_shapes import expand_shapes, problem_of

    monkeypatch.setenv("FMHA_DSL_TUNED_SHIPPED", "0")  # the candidates alone, whatever tables ship
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps(TINY_SHAPES))
    cache = tmp_path / "deploy"
    out = cli("precompile", "--shapes", str(shapes), "--arch", "sm90", "--cache-dir", str(cache), "--limit", "1")
    assert out.returncode == 0, out.stderr
    assert (f"1 kernel in the cache `{cache}` for 1 problem of `shapes.json` on sm90 (0 failed, 0 without a kernel)"
            in out.stdout) and f"FMHA_DSL_CACHE_DIR={cache}" in out.stdout
    # progress as the binaries come in (the kernel and its companion), not a silent wait
    assert re.search(r"^\[(\d+)/\1\] .* 0 failed", out.stderr, re.M), out.stderr
    (cls, pts), = expand_shapes(json.loads(shapes.read_text()))
    p = problem_of(cls, pts[0], "sm90")
    want = Builder().candidates(p, "sm90", limit=2)
    got = Builder(str(cache)).compile(want, cache_only=True)
    assert isinstance(got[0][1], dict) and not isinstance(got[1][1], dict)  # the best one cached, the next not


def _recording_builder(monkeypatch):
    """Builder.compile and .gather record what they are asked for instead of compiling."""
    from fmha_dsl.first_use import Builder

    asked = {"compile": [], "gather": []}
    monkeypatch.setattr(Builder, "compile", lambda self, entries, aligned=True, **kw: asked["compile"].append(
        list(entries)) or [(e, {e.identifier: b""}) for e in entries])
    monkeypatch.setattr(Builder, "gather", lambda self, p, arch, cache_only=False: asked["gather"].append(p) or (
        object(), b""))
    return asked


def test_precompile_always_compiles_what_a_shipped_table_names(monkeypatch):
    """With --limit, the candidates the cost model ranks highest; and always the shipped winner of the problem's
    class and the close runners-up first use would time again on that device (else the deployment's first call would
    compile them): of the named device's table, or of every table of the arch."""
    from fmha_dsl.first_use import Builder
    from fmha_dsl.keys import Problem
    from fmha_dsl.precompile import precompile_report
    from fmha_dsl.runtime import decisions

    p = Problem(family="fwd", dtype="bf16", arch="sm90", batch=4, nhead_q=16, nhead_k=16, seqlen_q=4096,
                seqlen_k=4096, hdim_q=128, hdim_v=128, mask="top_left")
    tables = decisions.shipped_tables("sm90")
    assert {"NVIDIA H200", "NVIDIA H100 80GB HBM3"} <= set(tables)
    recs = {d: t[decisions.key(p)] for d, t in tables.items()}
    assert all(r["space"] == Builder().fingerprint("fwd") for r in recs.values()), "tables stale: retune them"
    every = {e.name: e.identifier for e in Builder().candidates(p, "sm90", True, 1 << 30)}
    named = {d: {every[r["kernel"]], *(every[n] for n in decisions.close_runners_up(r))} for d, r in recs.items()}
    asked = _recording_builder(monkeypatch)
    top = {e.identifier for e in Builder().candidates(p, "sm90", True, 1)}
    got = precompile_report([p], "sm90", limit=1, device="NVIDIA H200")
    assert got == (len(top | named["NVIDIA H200"]), [], []) and len(named["NVIDIA H200"] - top) > 1
    assert {e.identifier for e in asked["compile"][-1]} == top | named["NVIDIA H200"]
    precompile_report([p], "sm90", limit=1)
    assert {e.identifier for e in asked["compile"][-1]} == top.union(*named.values())
    precompile_report([p], "sm90", limit=1, device="no such GPU")
    assert {e.identifier for e in asked["compile"][-1]} == top
    monkeypatch.setenv("FMHA_DSL_TUNED_SHIPPED", "0")   # shipped tables ignored: the candidates alone
    precompile_report([p], "sm90", limit=1)
    assert {e.identifier for e in asked["compile"][-1]} == top and not asked["gather"]


def test_precompile_adds_what_a_call_of_the_problem_also_decides(monkeypatch):
    """A backward problem's training step also decides its forward with LSE; a paged prefill that may take the
    gathered route also needs the copy kernel and the forward problem over the copy (group mode); a problem the rules
    allow no kernel for is reported, not skipped in silence."""
    from fmha_dsl.keys import Problem
    from fmha_dsl.precompile import precompile_report
    from fmha_dsl.runtime.tune_shapes import expand_shapes, problem_of

    monkeypatch.setenv("FMHA_DSL_TUNED_SHIPPED", "0")
    asked = _recording_builder(monkeypatch)
    bwd = Problem(family="bwd_dq_dk_dv", dtype="bf16", arch="sm90", batch=2, nhead_q=4, nhead_k=4, seqlen_q=512,
                  seqlen_k=512, hdim_q=64, hdim_v=64, mask="top_left")
    precompile_report([bwd], "sm90", limit=1)
    fams = sorted((e.sig["family"], e.sig["lse"]) for e in asked["compile"][-1])
    assert len(fams) == 2 and fams[0] == ("bwd_dq_dk_dv", False) and fams[1][0] in ("fwd", "fwd_splitkv"), fams
    assert fams[1][1] is True  # the forward that saves its LSE for the backward
    (cls, pts), = expand_shapes({"classes": [{"family": "batch_prefill", "dtype": "bf16", "hdim": 128,
                                              "mask": "causal", "nhead_q": 8, "nhead_k": 2, "seqlens": [2048],
                                              "batch": [2]}]})
    paged = problem_of(cls, pts[0], "sm90")
    got = precompile_report([paged], "sm90", limit=1)
    modes = sorted((e.sig["family"], e.sig["mode"]) for e in asked["compile"][-1])
    assert modes == [("batch_prefill", "group"), ("fwd", "group")] and asked["gather"] == [paged]
    assert got.cached == 3 and not got.failed
    huge = bwd.model_copy(update={"family": "fwd", "hdim_q": 1024, "hdim_v": 1024})
    got = precompile_report([huge], "sm90")
    assert got.cached == 0 and len(got.no_kernel) == 1 and "1024" in got.no_kernel[0]


def test_precompile_input_errors_exit_2_naming_the_argument(tmp_path, monkeypatch):
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps(TINY_SHAPES))
    afile = tmp_path / "a_file"
    afile.write_text("")
    c = str(tmp_path / "c")
    cases = [(("--arch", "sm9", "--cache-dir", c), ["--arch `sm9`", "did you mean `sm90`?"]),
             (("--arch", "sm90", "--cache-dir", str(afile)), [f"cannot write the cache folder `{afile}`",
                                                                 "--cache-dir"]),
             (("--arch", "sm90", "--cache-dir", ""), ["--cache-dir is empty"]),
             (("--arch", "sm90", "--cache-dir", c, "--shapes", str(tmp_path / "none.json")),
              ["cannot read the shape matrix", "--shapes"]),
             (("--arch", "sm90", "--limit", "0"), ["--limit"]),
             (("--arch", "sm90", "--cache-dir", c, "--device", " "), ["--device is empty"]),
             (("--arch", "sm90", "--cache-dir", c, "--device", "NVIDIA H100"),
              ["--device `NVIDIA H100`", "did you mean `NVIDIA H100 80GB HBM3`?"]),
             (("--arch", "sm90", "--cache-dir", c, "--device", "nvidia h200"), ["did you mean `NVIDIA H200`?"])]
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"classes": []}))
    cases.append((("--arch", "sm90", "--cache-dir", c, "--shapes", str(empty)), ["names no problem"]))
    for args, words in cases:
        out = cli("precompile", *([] if "--shapes" in args else ["--shapes", str(shapes)]), *args)
        assert out.returncode == 2 and "Traceback" not in out.stderr, (args, out.stderr)
        for w in words:
            assert w in out.stderr, (args, w, out.stderr)
    assert not os.path.exists(c)  # every input is checked before the folder is made


def test_precompile_without_any_kernel_exits_1_and_says_why(tmp_path):
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps({"classes": [dict(TINY_SHAPES["classes"][0], hdim=1024)]}))
    out = cli("precompile", "--shapes", str(shapes), "--arch", "sm90", "--cache-dir", str(tmp_path / "c"))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "the Triton rules allow no kernel on sm90 for" in out.stderr and "1 without a kernel" in out.stdout


def test_build_verbose_lists_what_each_rule_dropped(tmp_path):
    src = tmp_path / "g.fmha"
    src.write_text(GOOD)
    r = cli("build", str(src), "--arch", "gfx942", "-o", str(tmp_path / "out"), "-v")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^  dropped +\d+ by \S+", r.stdout, re.M), r.stdout
