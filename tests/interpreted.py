"""A script run under Triton's CPU interpreter in a fresh process, for the end-to-end tests of the torch path
(imported by test modules; not a test module)."""

import os
import subprocess
import sys

import pytest


def run_interpreted(script: str, marker: str, timeout: int = 600) -> str:
    """Run ``script`` with ``TRITON_INTERPRET=1`` in a fresh interpreter (skipped without torch or triton); it must
    exit 0 and print ``marker``.  Returns its stdout."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert marker in out.stdout, out.stdout[-3000:]
    return out.stdout
