"""bench/install_tuned.py --family: one family's shipped decisions replaced from measured tables, the others kept;
a family with nothing measured is refused, the table untouched."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _dec(kernel: str, n: int = 6) -> dict:
    return {"kernel": kernel, "times_us": {f"{kernel}_{i}": float(i + 1) for i in range(n)}}


def _run(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "bench", "install_tuned.py"), *args], cwd=ROOT,
                          capture_output=True, text=True)


def _tables(tmp_path):
    shipped = {"arch": "sm90", "device": "NVIDIA H200", "version": 2, "provenance": "measured once",
               "date": "2026-11-20", "decisions": {"fwd.bf16.a": _dec("f_old"), "bwd_dq_dk_dv.bf16.a": _dec("b_old"),
                                                   "bwd_dq_dk_dv.bf16.b": _dec("b_old2")}}
    run1 = {"arch": "sm90", "device": "NVIDIA H200", "version": 2,
            "decisions": {"fwd.bf16.a": _dec("f_new"), "bwd_dq_dk_dv.bf16.a": _dec("b_new")}}
    run2 = {"arch": "sm90", "device": "NVIDIA H200", "version": 2,
            "decisions": {"bwd_dq_dk_dv.bf16.b": _dec("b_new2"), "bwd_dq_dk_dv.bf16.c": _dec("too_few", 2)}}
    paths = []
    for name, doc in (("shipped", shipped), ("run1", run1), ("run2", run2)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(doc))
    return paths


def test_family_replaces_only_that_familys_decisions(tmp_path):
    shipped, run1, run2 = _tables(tmp_path)
    out = _run(str(run1), str(run2), "--into", str(shipped), "--family", "bwd_dq_dk_dv", "--provenance", "rerun")
    assert out.returncode == 0, out.stderr
    doc = json.loads(shipped.read_text())
    kernels = {k: v["kernel"] for k, v in doc["decisions"].items()}
    # the forward decision is kept although run1 measured it; the one timed over too few candidates is not shipped
    assert kernels == {"fwd.bf16.a": "f_old", "bwd_dq_dk_dv.bf16.a": "b_new", "bwd_dq_dk_dv.bf16.b": "b_new2"}
    assert doc["provenance"].startswith("measured once. ") and doc["provenance"].endswith(
        "bwd_dq_dk_dv decisions measured again: rerun")


def test_a_family_with_nothing_measured_is_refused_and_the_table_kept(tmp_path):
    shipped, run1, _ = _tables(tmp_path)
    before = shipped.read_text()
    out = _run(str(run1), "--into", str(shipped), "--family", "bwd_typo", "--provenance", "x")
    assert out.returncode == 2 and "no bwd_typo decisions" in out.stderr
    assert shipped.read_text() == before
