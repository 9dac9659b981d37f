"""bench/probe_padcost.py refuses a malformed ``--cases`` before it touches a GPU: exit 2, naming the case and the
form it expects."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("cases,says", [("1000:abc", "is not padded_len:aligned_len:causal"),
                                        ("1000:1024", "is not padded_len:aligned_len:causal"),
                                        ("1000:1000:1", "the aligned one a multiple of 128"),
                                        ("1000:1024:2", "causal 0 or 1"),
                                        ("0:1024:0", "lengths of at least 1")])
def test_a_malformed_case_is_refused(cases, says):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "probe_padcost.py"), "--cases", cases],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert f"'{cases}'" in r.stderr and says in r.stderr and "Traceback" not in r.stderr
