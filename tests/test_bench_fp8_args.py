"""bench/bench_fp8_serving.py, bench/probe_fp8_decode.py, bench/profile_bwd.py, bench/probe_route.py,
bench/probe_sass_paged.py, bench/measure_bwd_shared.py, bench/probe_flag_cut.py, bench/bench_window.py and
bench/probe_gather_block.py refuse malformed arguments before they touch a GPU or compile: exit 2 with their usage,
no traceback."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("script,args,says", [
    ("bench_fp8_serving.py", ["--parts", "decode,train"], "--parts takes decode, prefill or decode,prefill, got "
                                                          "'decode,train'"),
    ("bench_fp8_serving.py", ["--parts", ""], "--parts takes decode, prefill"),
    ("probe_fp8_decode.py", ["32x8192", "3y4"], "usage: probe_fp8_decode.py [--fp8-only] [BxS ...]"),
    ("profile_bwd.py", ["gaps"], "usage: python3 -P bench/profile_bwd.py warm|one [SEQLEN] | kernels | gap"),
    ("profile_bwd.py", ["warm", "4k"], "SEQLEN: a positive integer"),
    ("probe_route.py", ["bf16,64,causal"], "expected DTYPE,D,MASK,SEQLEN (e.g. bf16,64,causal,16384)"),
    ("probe_route.py", ["fp8,64,full,1024"], "DTYPE is one of bf16, fp16"),
    ("probe_route.py", ["bf16,64,top_left,1024"], "MASK is one of full, causal"),
    ("probe_route.py", ["bf16,64,full,16k"], "SEQLEN is a positive integer up to 16384"),
    ("probe_route.py", ["--rounds", "0"], "--rounds: at least 1"),
    ("probe_sass_paged.py", ["--tiles", "128x64"], "--tiles: each M0xN0wWARPS, e.g. 128x64w8, got '128x64'"),
    ("probe_sass_paged.py", ["--pages", "16k"], "--pages: page sizes, e.g. 16,1024, got '16k'"),
    ("measure_bwd_shared.py", ["--arch", "sm99", "--json", "/tmp/x.json"], "argument --arch: invalid choice: 'sm99'"),
    ("measure_bwd_shared.py", ["--arch", "sm90", "--dtype", "fp8", "--json", "/tmp/x.json"],
     "argument --dtype: invalid choice: 'fp8'"),
    ("measure_bwd_shared.py", ["--arch", "sm90", "-j", "0", "--json", "/tmp/x.json"], "-j/--jobs: must be a whole"),
    ("measure_bwd_shared.py", ["--arch", "sm90", "--json", "/nonexistent/dir/x.json"],
     "--json: cannot write /nonexistent/dir/x.json"),
    ("probe_flag_cut.py", ["--json", "/nonexistent/dir/x.json"], "--json: cannot write /nonexistent/dir/x.json"),
    ("probe_flag_cut.py", ["--quick"], "run with FMHA_DSL_TUNED_SHIPPED=0"),
    ("bench_window.py", ["--parts", "decode,serve"], "--parts takes decode, prefill and train, comma-separated, got "
                                                    "'decode,serve'"),
    ("bench_window.py", ["--json", "/nonexistent/dir/x.json"], "--json: cannot write /nonexistent/dir/x.json"),
    ("probe_gather_block.py", ["--rows", "12"], "--rows must be a power of two >= 1, got 12"),
    ("probe_gather_block.py", ["--rows", "16", "--json", "/nonexistent/dir/x.json"],
     "--json: cannot write /nonexistent/dir/x.json"),
    ("probe_flag_cut.py", ["--only", "steps", "--select", "softcap"],
     "--select: no class of --only steps has 'softcap' in its name; the classes: fp32 d64, "),
])
def test_bad_arguments_exit_2_with_the_usage(script, args, says):
    env = {k: v for k, v in os.environ.items() if k != "FMHA_DSL_TUNED_SHIPPED"}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr


def test_the_sass_probe_names_the_flag_of_a_value_the_rules_refuse():
    """A qscale the rules do not know is a usage error naming the flags and the allowed values (exit 2), not the
    line and column of the kernel-set text the probe writes."""
    pytest.importorskip("triton")
    from fmha_dsl import sass

    if not sass.available():
        pytest.skip("Triton's bundled cuobjdump is missing")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "probe_sass_paged.py"), "--qscale", "bogus",
                        "--pages", "16", "--tiles", "64x64w4"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "--qscale bogus" in r.stderr and "unknown qscale `bogus`" in r.stderr and "per_token_head" in r.stderr
    assert "probe.fmha" not in r.stderr and "Traceback" not in r.stderr
