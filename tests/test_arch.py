"""One table of arch facts (fmha_dsl/data/archs.json through fmha_dsl/arch.py); the rest of the code reads it."""

import os
import re

from fmha_dsl import arch, vocab

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIRED = ("vendor", "family", "backends", "ck_factory", "backend", "target", "warp_size", "shared_bytes",
            "matrix", "dtypes", "max_stages", "max_warps", "max_regs_per_thread", "compute_units", "binary")


def test_every_arch_has_every_fact():
    assert arch.names() == vocab.ARCHS
    for a in arch.names():
        info = arch.info(a)
        assert all(k in info for k in REQUIRED), (a, [k for k in REQUIRED if k not in info])
        assert info["binary"] == {"amd": "hsaco", "nvidia": "cubin"}[info["vendor"]]
        assert (info["vendor"] == "nvidia") == ("capability" in info)
    assert arch.of_capability(9) == "sm90" and arch.of_capability(8) == "sm80" and arch.of_capability(7) is None
    assert arch.backend_archs("ck") == arch.vendor_archs("amd")
    assert arch.get(None) == {} and arch.get("gfx000") == {}


def test_only_arch_py_reads_the_table():
    """No other module opens archs.json or spells out an arch list of its own."""
    arch_list = re.compile(r'\(\s*"gfx90a",\s*"gfx942"')
    bad = []
    for top in ("fmha_dsl", "runtime"):
        for dirpath, _, files in os.walk(os.path.join(REPO, top)):
            for f in files:
                path = os.path.join(dirpath, f)
                if not f.endswith(".py") or path == os.path.join(REPO, "fmha_dsl", "arch.py"):
                    continue
                text = open(path, encoding="utf-8").read()
                if re.search(r'load\(\s*"archs"\s*\)', text) or arch_list.search(text):
                    bad.append(path)
    assert not bad, bad
