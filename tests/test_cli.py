"""The command line: exit codes, formats, help, output files."""

import json
import os
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
    for cmd in ("check", "list", "explain", "build", "fmt", "schema"):
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
