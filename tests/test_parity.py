"""Parity with CK's upstream generator (generate.py --list_blobs, receipt 0, simplified masks).

Truth: the instance lists CK's own generator printed for gfx942 (tests/data/oracle, copied from
shared/oracle) and the per-arch counts measured from upstream runs (shared/oracle/README.md).
"""

import gzip
import re
import os
import subprocess
import sys

import pytest

import fmha_dsl

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE = os.path.join(HERE, "data", "oracle", "gfx942_r0")
APIS = ("fwd", "fwd_splitkv", "fwd_appendkv", "pagedkv_prefill", "batch_prefill", "bwd")


def oracle(api=None) -> set:
    out = set()
    for a in ([api] if api else APIS):
        with gzip.open(os.path.join(ORACLE, f"{a}.txt.gz"), "rt") as f:
            out.update(line.strip() for line in f if line.strip())
    return out


@pytest.fixture(scope="module")
def receipt0():
    return fmha_dsl.load(fmha_dsl.shipped("ck_receipt0"))


def names(ks, arch, profile=None):
    return [k.name for k in ks.expand_report(arch=arch, profile=profile).kernels]


def test_gfx942_receipt0_equals_upstream_line_for_line():
    """The acceptance bar: `fmha-dsl list ck_receipt0 --arch gfx942 --format ck-names` == upstream."""
    exe = [sys.executable, "-m", "fmha_dsl.cli"]
    out = subprocess.run(exe + ["list", "ck_receipt0", "--arch", "gfx942", "--format", "ck-names"],
                         capture_output=True, text=True, cwd=HERE)
    assert out.returncode == 0, out.stderr
    got = out.stdout.splitlines()
    want = sorted(oracle())
    assert len(want) == 22785
    assert got == want


@pytest.mark.parametrize("api,family_prefixes", [
    ("fwd", ("fmha_fwd_d",)),
    ("fwd_splitkv", ("fmha_fwd_splitkv_",)),
    ("fwd_appendkv", ("fmha_fwd_appendkv_",)),
    ("pagedkv_prefill", ("fmha_fwd_pagedkv_",)),
    ("batch_prefill", ("fmha_batch_prefill_",)),
    ("bwd", ("fmha_bwd_",)),
])
def test_gfx942_per_api(receipt0, api, family_prefixes):
    got = {n for n in names(receipt0, "gfx942") if n.startswith(family_prefixes)}
    want = oracle(api)
    assert sorted(got - want)[:5] == [] and sorted(want - got)[:5] == []
    assert got == want


def test_no_duplicate_names_per_arch(receipt0):
    got = names(receipt0, "gfx942")
    assert len(got) == len(set(got))


def test_gfx90a_equals_gfx942(receipt0):
    """Upstream: gfx90a and gfx942 share the gfx9 factory and give identical lists."""
    assert sorted(names(receipt0, "gfx90a")) == sorted(oracle())


def _count(ns, prefix):
    """Names starting with `prefix`; a trailing `d` must be followed by the head dim (d128...)."""
    pat = re.compile(re.escape(prefix) + (r"\d" if prefix.endswith("_d") else ""))
    return sum(1 for n in ns if pat.match(n))


def test_gfx950_counts(receipt0):
    """oracle/README.md: gfx950 = fwd 7760, bwd 60 + 8064 + 132, the others as gfx942."""
    ns = names(receipt0, "gfx950")
    assert _count(ns, "fmha_fwd_d") == 7760
    assert _count(ns, "fmha_bwd_dot_do_o_") == 60
    assert _count(ns, "fmha_bwd_convert_dq_") == 132
    assert _count(ns, "fmha_bwd_d") == 8064
    assert _count(ns, "fmha_fwd_splitkv_combine_") == 138
    assert _count(ns, "fmha_fwd_splitkv_d") == 1968
    assert _count(ns, "fmha_fwd_appendkv_") == 99
    assert _count(ns, "fmha_fwd_pagedkv_") == 168
    assert _count(ns, "fmha_batch_prefill_") == 6304
    # split-KV, append-KV and paged-KV have no gfx950 factory: gfx950 gets the gfx9 lists
    gfx9 = oracle("fwd_splitkv") | oracle("fwd_appendkv") | oracle("pagedkv_prefill") | oracle("batch_prefill")
    assert {n for n in ns if n.startswith(("fmha_fwd_splitkv", "fmha_fwd_appendkv", "fmha_fwd_pagedkv",
                                           "fmha_batch_prefill"))} == gfx9


def test_gfx11_has_no_appendkv_bwd_or_batch_prefill(receipt0):
    rep = receipt0.expand_report(arch="gfx1100")
    ns = [k.name for k in rep.kernels]
    assert not any(n.startswith(("fmha_fwd_appendkv", "fmha_bwd", "fmha_batch_prefill")) for n in ns)
    assert all(n.endswith("_gfx11") for n in ns)
    notes = " ".join(d.message for d in rep.notes)
    for fam in ("fwd_appendkv", "bwd_dq_dk_dv", "batch_prefill"):
        assert f"{fam} is not supported on gfx1100" in notes


def test_partial_wildcards_select_the_matching_slice(tmp_path):
    """Explicit fields narrow the wildcard space to exactly the matching upstream instances."""
    p = tmp_path / "slice.fmha"
    p.write_text("""
kernel_set slice {
    arch(gfx942)
    kernel k {
        signature { family(fwd) dtype(bf16) mode(batch) hdim(128) mask(*) bias(*) lse(*) dropout(*)
                    logits(*) skip(*) sink(*) qscale(*) vlayout(*) }
        algorithm { pipeline(*) tile(*) padding(*) trload(*) }
    }
}""")
    got = sorted(k.name for k in fmha_dsl.load(str(p)).expand_report().kernels)
    want = sorted(n for n in oracle("fwd") if n.startswith("fmha_fwd_d128_bf16_batch_"))
    assert got == want


def test_where_clause_filters_like_a_list_filter(tmp_path):
    p = tmp_path / "w.fmha"
    p.write_text("""
kernel_set w {
    arch(gfx942)
    dtype(*) mode(*) vlayout(*) hdim(*) mask(*) bias(*) lse(*) dropout(*) qscale(*) logits(*) skip(*) sink(*)
    pipeline(*) tile(*) padding(*) trload(*)
    kernel k {
        signature { family(fwd) }
        where hdim_q == 64 and pipeline != "qr" and tile_m0 >= 64
    }
}""")
    got = sorted(k.name for k in fmha_dsl.load(str(p)).expand_report().kernels)
    def m0(name):  # fmha_fwd_d64_fp16_batch_b128x64x... -> 128
        return int(name.split("_")[5][1:].split("x")[0])

    want = sorted(n for n in oracle("fwd") if n.startswith("fmha_fwd_d64_") and "_qr_v" not in n and m0(n) >= 64)
    assert got == want and got


@pytest.mark.parametrize("arch", ["gfx942", "gfx950", "gfx1100", "gfx1201"])
def test_engine_keys_revalidate(receipt0, arch):
    """Keys are built without validation for speed; every one must pass full Pydantic validation."""
    from fmha_dsl.keys import KernelKey

    kernels = receipt0.expand_report(arch=arch).kernels
    for k in kernels[:: max(1, len(kernels) // 400)]:
        again = KernelKey.model_validate_json(k.key.model_dump_json())
        assert again == k.key
        assert again.identifier == k.identifier


def _independent():
    import json

    with open(os.path.join(HERE, "data", "independent_enumerators.json")) as f:
        return json.load(f)["lists"]


@pytest.mark.parametrize("case", sorted(_independent()))
def test_other_archs_and_receipts_match_independent_enumerators(receipt0, case):
    """gfx90a/gfx950/gfx1100/gfx1201 at receipt 0 and receipts 2, 4, 100, 200, 600, 888 on gfx942/gfx950."""
    import hashlib

    arch, receipt = case.split("/")
    want = _independent()[case]
    got = sorted({k.name for k in receipt0.expand_report(arch=arch, profile=int(receipt)).kernels})
    assert len(got) == want["count"]
    assert hashlib.sha256("\n".join(got).encode()).hexdigest() == want["sha256"]
