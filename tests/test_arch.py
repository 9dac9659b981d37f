"""One table of arch facts (fmha_dsl/data/archs.json through fmha_dsl/arch.py); the rest of the code reads it."""

import re

from sources import python_sources

from fmha_dsl import arch, vocab

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
    bad = [path for path, text in python_sources(skip=("fmha_dsl/arch.py",))
           if re.search(r'load\(\s*"archs"\s*\)', text) or arch_list.search(text)]
    assert not bad, bad
