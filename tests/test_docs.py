"""The docs are real: the README's example kernel set expands, and every shell command shown in README.md and
docs/*.md runs (or, for a usage synopsis, names a command and flags that exist)."""

import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

import fmha_dsl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
DOCS = [README] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))


def test_readme_kernel_set_expands():
    with open(README) as f:
        text = f.read()
    blocks = re.findall(r"```\n(kernel_set \w+ \{.*?\n\})\n```", text, re.S)
    assert blocks, "README lost its example kernel set"
    for block in blocks:
        rep = fmha_dsl.loads(block).expand_report()
        assert rep.kernels and not rep.notes


# ---- every shell command of the docs ----------------------------------------------------------------------
def shown_commands() -> list[tuple[str, str]]:
    """(doc, command): each line of a ```sh/```bash block, and each inline `fmha-dsl ...` / `python ...` span;
    `a && b` is two commands, a trailing `# comment` is dropped."""
    out = []
    for path in DOCS:
        with open(path) as f:
            text = f.read()
        found = []
        for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
            if lang in ("sh", "bash", "console", "shell"):
                found += [ln.strip().removeprefix("$ ") for ln in body.splitlines()]
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        found += re.findall(r"`((?:fmha-dsl|python3?|pip|pytest)\b[^`]*)`", prose)
        for line in found:
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            for cmd in (c.strip() for c in line.split("&&")):
                if cmd:
                    out.append((os.path.relpath(path, REPO), cmd))
    return list(dict.fromkeys(out))


PLACEHOLDER = re.compile(r"(^|[\s=,\[])([A-Z][A-Z0-9_]*)([\s\],]|$)|<[^>]*>|\[|\\\|")
GPU_BENCH = ("bench/bench_fwd.py", "bench/bench_dispatch.py", "bench/bench_launch.py", "bench/bench_select.py",
             "bench/probe_hopper_fa.py", "bench/sweep_fwd_configs.py", "bench/bench_bwd.py",
             "bench/sweep_bwd_configs.py", "bench/bench_default.py", "bench/bench_train_step.py",
             "bench/profile_decode.py", "bench/profile_bwd.py", "bench/probe_pdl.py", "bench/probe_padcost.py",
             "bench/probe_firstuse.py", "bench/probe_thermal.py", "bench/probe_sustain.py", "bench/bench_serving.py",
             "bench/probe_flush.py", "bench/probe_splits.py", "bench/probe_decode_latency.py",
             "bench/probe_placement.py", "bench/probe_vectorized.py", "bench/bench_fp8_serving.py",
             "bench/probe_fp8_decode.py", "bench/probe_route.py", "bench/bench_firstcall.py",
             "bench/probe_confirm.py", "bench/profile_firstcall.py", "bench/probe_flag_cut.py",
             "bench/bench_window.py", "bench/probe_gather_block.py")
SASS_PROBES = ("bench/probe_sass_paged.py",)   # compile sm90 kernels (no GPU) and read their SASS: minutes on CI
TRITON_SETS = ("bench_fwd", "seqtune_fwd")


def classify(cmd: str) -> tuple[str, str]:
    """("run" | "synopsis" | "skip", why).  The skip rule, explicitly: network installs, this very test suite,
    anything that needs a GPU (tune, the GPU benchmarks), and builds of Triton sets, which compile every kernel
    (minutes on CI's 2 cores; tests/test_build_triton.py builds a small Triton set instead)."""
    words = cmd.split()
    if words[0] == "pip":
        return "skip", "network: installs packages (CI does its own install)"
    if words[0] == "pytest":
        return "skip", "this test suite"
    if words[0] in ("python", "python3") and any(w in GPU_BENCH for w in words):
        return "skip", "a GPU benchmark"
    if words[0] in ("python", "python3") and any(w in SASS_PROBES for w in words):
        return "skip", "compiles kernels to read their SASS"
    if PLACEHOLDER.search(cmd):
        return "synopsis", "placeholders (FILE, DIR, <x>, [optional], a|b): check the command and flags exist"
    if words[0] == "fmha-dsl" and (len(words) == 1 or (len(words) <= 3 and words[-1].startswith("-"))
                                   or (len(words) == 2 and words[1] != "schema")):
        return "synopsis", "a command named in prose, without its arguments"
    if words[0] == "fmha-dsl" and words[1] == "tune":
        return "skip", "needs a GPU"
    if words[0] == "fmha-dsl" and "build" in words and ("--backend" in words and "triton" in words
                                                        or any(s in w for w in words for s in TRITON_SETS)):
        return "skip", "a Triton build compiles every kernel: too slow for CI"
    return "run", ""


COMMANDS = shown_commands()


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 20
    assert any("bench_expand.py" in c for _, c in COMMANDS) and any("schema rules" in c for _, c in COMMANDS)


def _argv(words: list[str]) -> list[str]:
    if words[0] == "fmha-dsl":
        return [sys.executable, "-m", "fmha_dsl.cli", *words[1:]]
    if words[0] in ("python", "python3"):
        return [sys.executable, *words[1:]]
    raise AssertionError(f"no rule to run {words}")


@pytest.mark.parametrize("doc,cmd", [c for c in COMMANDS if classify(c[1])[0] == "run"],
                         ids=lambda v: v if "/" not in v or " " in v else os.path.basename(v))
def test_shown_command_runs(doc, cmd, tmp_path):
    """From the repository root, as the docs show them; outputs go to a temporary folder."""
    words = shlex.split(cmd)
    cwd = str(tmp_path)
    if words[0] in ("python", "python3"):  # repository scripts: from the root, as documented
        cwd = REPO
    else:
        words = [os.path.join(REPO, w) if w.startswith("kernelsets/") else w for w in words]
    r = subprocess.run(_argv(words), capture_output=True, text=True, cwd=cwd, timeout=600,
                       env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert r.returncode == 0, f"{doc}: `{cmd}` exited {r.returncode}:\n{r.stderr[-2000:]}"
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("doc,cmd", [c for c in COMMANDS if classify(c[1]) in (("skip", "a GPU benchmark"),
                                                                               ("skip", "compiles kernels to read "
                                                                                        "their SASS"))])
def test_shown_gpu_benchmark_names_a_real_script_and_its_flags(doc, cmd):
    """A GPU benchmark (or a SASS probe, too slow for CI) does not run here, but the script it names exists and
    takes every flag shown."""
    path = next(w for w in cmd.split() if w in GPU_BENCH + SASS_PROBES)
    with open(os.path.join(REPO, path)) as f:
        source = f.read()
    for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", cmd):
        assert f'"{flag}"' in source, f"{doc}: `{cmd}`: {path} takes no {flag}"


@pytest.mark.parametrize("doc,cmd", [c for c in COMMANDS if classify(c[1])[0] == "synopsis"])
def test_shown_synopsis_names_real_commands_and_flags(doc, cmd):
    words = cmd.replace("\\|", "|").split()
    if words[0] != "fmha-dsl":
        path = next((w for w in words if w.endswith(".py")), None)
        assert path and os.path.exists(os.path.join(REPO, path)), f"{doc}: `{cmd}` names no script of the repository"
        return
    sub = words[1] if len(words) > 1 and not words[1].startswith("-") else None
    r = subprocess.run(_argv(["fmha-dsl", *([sub] if sub else []), "--help"]), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"{doc}: `{cmd}`: no command `{sub}`"
    for flag in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", cmd):
        assert re.search(rf"(?<![\w-]){re.escape(flag)}\b", r.stdout), f"{doc}: `{cmd}`: no flag {flag}"
    if sub == "schema":
        for choice in re.sub(r"^schema\s+", "", " ".join(words[1:])).split("|"):
            assert choice.strip() in r.stdout, f"{doc}: `{cmd}`: no `schema {choice}`"


def test_readme_command_table_lists_every_command():
    """README's table names each subcommand, and every `schema` choice (`schema rules` was missing)."""
    from fmha_dsl.cli import _parser

    with open(README) as f:
        table = [ln for ln in f if ln.startswith("| `fmha-dsl ")]
    listed = {ln.split()[2] for ln in table}
    sub = next(a for a in _parser()._actions if a.dest == "cmd")
    assert listed == set(sub.choices)
    schema_row = next(ln for ln in table if ln.startswith("| `fmha-dsl schema"))
    schema = sub.choices["schema"]
    what = next(a for a in schema._actions if a.dest == "what")
    assert all(f"{c}" in schema_row for c in what.choices)


