"""bench/bench_fp8_serving.py, bench/probe_fp8_decode.py and bench/profile_bwd.py refuse malformed arguments before
they touch a GPU: exit 2 with their usage, no traceback."""

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
])
def test_bad_arguments_exit_2_with_the_usage(script, args, says):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr
