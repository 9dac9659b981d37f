"""Registry: deterministic JSON, byte-identical round trip, schema-checked loading."""

import json

import pytest

import fmha_dsl
from fmha_dsl import Registry, RegistryError

SET = """
kernel_set small {
    arch(gfx942, gfx950)
    kernel fwd128 {
        signature { family(fwd) dtype(fp16 | bf16) mode(*) hdim(128) mask(*) lse(*) }
        algorithm { pipeline(*) tile(*) padding(*) }
    }
    kernel dot {
        signature { family(bwd_dot_do_o) dtype(*) hdim(*) mode(*) }
        algorithm { padding(*) }
    }
}
"""


@pytest.fixture
def reg(write):
    return fmha_dsl.load(write("small.fmha", SET)).registry()


def test_superset_of_ck_format(reg):
    doc = json.loads(reg.to_json())
    assert doc["schema_version"] == 1
    assert doc["metadata"]["registry_name"] == "small"
    assert doc["metadata"]["total_kernels"] == len(reg) == len(doc["kernels"])
    assert set(doc["statistics"]) == {"by_family", "by_dtype", "by_pipeline", "by_arch"}
    assert sum(doc["statistics"]["by_arch"].values()) == len(reg)
    k = doc["kernels"][0]
    for field in ("name", "identifier", "family", "dtype", "pipeline", "gfx_arch", "signature", "algorithm", "source"):
        assert field in k
    assert k["source"].endswith(":4") or k["source"].endswith(":8")
    assert set(doc["metadata"]["archs"]) == {"gfx942", "gfx950"}


def test_round_trip_is_byte_identical(reg, tmp_path):
    p1, p2 = tmp_path / "a.json", tmp_path / "b.json"
    reg.save(p1)
    again = Registry.load(p1)
    again.save(p2)
    assert p1.read_bytes() == p2.read_bytes()
    assert [e.identifier for e in again] == [e.identifier for e in reg]
    assert again.lookup(next(iter(reg)).identifier).key == next(iter(reg)).key


def test_same_input_same_bytes(write):
    a = fmha_dsl.load(write("x.fmha", SET)).registry().to_json()
    b = fmha_dsl.load(write("x.fmha", SET)).registry().to_json()
    assert a == b


def test_arch_aware_lookup_and_filters(reg):
    g942 = reg.for_arch("gfx942")
    assert g942.archs == ["gfx942"] and 0 < len(g942) < len(reg)
    assert all(e.arch == "gfx942" for e in g942)
    dots = reg.filter(family="bwd_dot_do_o", arch="gfx950")
    assert dots and all(e.family == "bwd_dot_do_o" for e in dots)
    # CK names carry the arch's target suffix (gfx942 builds `_gfx9`, gfx950 `_gfx950`): one kernel per name
    g950 = reg.for_arch("gfx950")
    assert {e.name.removesuffix("_gfx9") for e in g942} == {e.name.removesuffix("_gfx950") for e in g950}
    e = next(iter(g942))
    assert [x.arch for x in reg.by_name(e.name)] == ["gfx942"] and e.name.endswith("_gfx9")
    assert len({x.identifier for x in reg}) == len(reg)


def test_first_registration_wins(reg):
    e = next(iter(reg))
    r = Registry("x")
    assert r.add(e) and not r.add(e)
    assert len(r) == 1


def _bad(tmp_path, text):
    p = tmp_path / "r.json"
    p.write_text(text)
    with pytest.raises(RegistryError) as info:
        Registry.load(p)
    return info.value


def test_truncated_json_is_located(reg, tmp_path):
    text = reg.to_json()
    err = _bad(tmp_path, text[: len(text) // 2])
    assert err.rule == "registry.json" and err.line > 1 and err.hint


def test_unknown_field_names_the_kernel_line(reg, tmp_path):
    doc = reg.to_json().split("\n")
    i = next(n for n, line in enumerate(doc) if line.startswith('{"algorithm"'))
    doc[i + 2] = doc[i + 2].replace('"dtype":', '"colour":"red","dtype":', 1)
    err = _bad(tmp_path, "\n".join(doc))
    assert err.rule == "registry.schema"
    assert err.line == i + 3
    assert "colour" in err.message or "kernels[2]" in err.message


def test_bad_value_and_versions(reg, tmp_path):
    doc = json.loads(reg.to_json())
    doc["kernels"][0]["signature"]["dtype"] = "fp17"
    assert _bad(tmp_path, json.dumps(doc)).rule == "registry.schema"
    doc = json.loads(reg.to_json())
    doc["schema_version"] = 99
    assert _bad(tmp_path, json.dumps(doc)).rule == "registry.schema-version"
    doc = json.loads(reg.to_json())
    doc["metadata"]["total_kernels"] += 1
    assert _bad(tmp_path, json.dumps(doc)).rule == "registry.count"
    doc = json.loads(reg.to_json())
    doc["kernels"][0]["algorithm"]["pipeline"] = "qs" if doc["kernels"][0]["algorithm"]["pipeline"] != "qs" else "qr"
    assert _bad(tmp_path, json.dumps(doc)).rule == "registry.identifier"
    doc = json.loads(reg.to_json())
    doc["kernels"].append(doc["kernels"][0])
    doc["metadata"]["total_kernels"] += 1
    assert _bad(tmp_path, json.dumps(doc)).rule == "registry.duplicate"
    for field, value in (("pipeline", "qs_edited"), ("dtype", "bf16x"), ("family", "bwd_x")):
        doc = json.loads(reg.to_json())   # CK's flat copy of a signature/algorithm field, edited alone
        doc["kernels"][0][field] = value
        err = _bad(tmp_path, json.dumps(doc))
        assert err.rule == "registry.flat-field" and f"`{field}` is '{value}'" in err.message


def test_missing_registry(tmp_path):
    with pytest.raises(RegistryError) as info:
        Registry.load(tmp_path / "nope.json")
    assert info.value.rule == "registry.missing" and "fmha-dsl build" in info.value.hint


def test_checked_in_schema_is_current():
    """docs/registry.schema.json is what `fmha-dsl schema registry` prints: bump schema_version on change."""
    import os

    from fmha_dsl.registry import json_schema

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "registry.schema.json")
    with open(path) as f:
        assert json.load(f) == json_schema()


def test_unknown_arch_is_a_located_schema_error(reg, tmp_path):
    doc = json.loads(reg.to_json())
    doc["kernels"][0]["gfx_arch"] = "gfx999"
    assert _bad(tmp_path, json.dumps(doc)).rule == "registry.schema"


def test_filtered_registry_keeps_its_folder(reg, tmp_path):
    reg.save(tmp_path / "registry.json")
    loaded = Registry.load(tmp_path / "registry.json")
    assert loaded.for_arch("gfx942").path == loaded.path


def test_registry_files_are_opened_only_by_the_registry_module():
    """fmha_dsl/registry.py is the one reader/writer of registry files (the seqtune table lives inside them): no
    other module spells the file name as a value (docstrings and messages may mention it)."""
    import ast

    from sources import python_sources

    bad = [f"{path}:{node.lineno}" for path, text in python_sources(skip=("fmha_dsl/registry.py",))
           for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Constant) and node.value == "registry.json"]
    assert not bad, "use fmha_dsl.registry.registry_path / Registry.load / read_document: " + ", ".join(bad)


def test_sources_name_every_file_as_the_kernels_do(tmp_path):
    """Two included files of one name in different folders are two sources (`metadata.sources` listed each file's
    base name once), named as each kernel's `source` names them."""
    for sub, dt in (("x", "fp16"), ("y", "bf16")):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "common.fmha").write_text(
            f"kernel_set c{sub} {{ arch(gfx942) kernel {{ signature {{ family(fwd) dtype({dt}) hdim(128) }} }} }}\n")
    top = tmp_path / "top.fmha"
    top.write_text('include "x/common.fmha"\ninclude "y/common.fmha"\n'
                   "kernel_set top { arch(gfx942) kernel { signature { family(fwd) dtype(fp16) hdim(64) } } }\n")
    doc = json.loads(fmha_dsl.load(str(top)).registry().to_json())
    assert doc["metadata"]["sources"] == ["top.fmha", "x/common.fmha", "y/common.fmha"]
    assert {k["source"].rsplit(":", 1)[0] for k in doc["kernels"]} == set(doc["metadata"]["sources"])
