"""Registry files damaged or crafted by hand: every reader refuses them with a located RegistryError (exit 2 from
the CLI), reads nothing outside the build directory, and never lets a corrupt table steer selection.  The cases
come from fuzzing the readers (Registry.load, the Dispatcher, the report, the tuned-decision tables)."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from fmha_dsl import seqtune
from fmha_dsl.errors import RegistryError
from fmha_dsl.kernels import abis
from fmha_dsl.registry import Entry, Registry
from fmha_dsl.runtime import decisions
from fmha_dsl.runtime.dispatch import Dispatcher
from test_seqtune import CLS, DEV, key, problem

BINARY = b"\x7fELF a stand-in cubin"


def _build_dir(tmp_path, n=1, table=False):
    """A build directory of ``n`` fwd kernels with real files and hashes (and a seqtune table)."""
    reg = Registry("edges")
    for i in range(n):
        rel = f"kernels/sm90/k{i}.cubin"
        (tmp_path / "kernels" / "sm90").mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(BINARY)
        reg.add(Entry(key(tile=(128, 64 * (i + 1))), f"k{i}", "x.fmha:1",
                      {"binary": rel, "sha256": hashlib.sha256(BINARY).hexdigest(), "entry": "fmha_fwd",
                       "params": list(abis.abi_of("fwd").names), "num_warps": 4, "shared": 1024,
                       "resources": {"regs": 128, "spills": 0}}))
    if table:
        t = seqtune.Table(DEV, "default")
        for s in (512, 2048):
            for i, e in enumerate(reg):
                t.record(CLS, (s, s, 16384 // s, 16, 16), e.identifier, float(s) / 10 + i)
        t.store(reg)
    reg.save(tmp_path / "registry.json")
    return tmp_path


def _edit(path, fn):
    doc = json.loads((path / "registry.json").read_text())
    fn(doc)
    (path / "registry.json").write_text(json.dumps(doc))


def _refused(path, rule, *fragments):
    with pytest.raises(RegistryError) as e:
        Registry.load(path)
    assert e.value.rule == rule, str(e.value)
    for f in fragments:
        assert f in str(e.value), str(e.value)
    return e.value


@pytest.mark.parametrize("binary", ["../../../../etc/passwd", "/etc/passwd", "kernels/../../x.cubin", "C:/x.cubin"])
def test_a_binary_path_outside_the_directory_is_refused_at_load(tmp_path, binary):
    d = _build_dir(tmp_path)
    _edit(d, lambda doc: doc["kernels"][0]["build"].update(binary=binary))
    _refused(d, "registry.schema", "kernels[0].build.binary", "must stay inside the build directory")


def test_a_binary_without_its_hash_is_refused(tmp_path):
    d = _build_dir(tmp_path)
    _edit(d, lambda doc: doc["kernels"][0]["build"].pop("sha256"))
    _refused(d, "registry.schema", "kernels[0].build", "needs its sha256")
    _edit(d, lambda doc: doc["kernels"][0]["build"].update(sha256=""))
    _refused(d, "registry.schema", "kernels[0].build.sha256")


def test_a_symlink_out_of_the_directory_is_not_read(tmp_path):
    d = _build_dir(tmp_path / "b")
    outside = tmp_path / "secret"
    outside.write_bytes(b"not yours")
    os.remove(d / "kernels/sm90/k0.cubin")
    os.symlink(outside, d / "kernels/sm90/k0.cubin")
    disp = Dispatcher(d, arch="sm90", limits={"shared_bytes": 232448, "compute_units": 132})
    with pytest.raises(RegistryError) as e:
        disp.binary(disp.entries[0])
    assert e.value.rule == "registry.binary" and "leads outside the build directory" in str(e.value)


def test_a_binary_too_large_to_be_one_is_not_read_whole(tmp_path):
    d = _build_dir(tmp_path)
    with open(d / "kernels/sm90/k0.cubin", "wb") as f:   # sparse: 300 MiB of nothing
        f.truncate(300 << 20)
    disp = Dispatcher(d, arch="sm90", limits={"shared_bytes": 232448, "compute_units": 132})
    with pytest.raises(RegistryError) as e:
        disp.binary(disp.entries[0])
    assert e.value.rule == "registry.binary" and "larger than a kernel binary can be" in str(e.value)


def test_a_missing_binary_is_reported_when_the_directory_is_opened(tmp_path):
    d = _build_dir(tmp_path, n=2)
    os.remove(d / "kernels/sm90/k1.cubin")
    with pytest.raises(RegistryError) as e:
        Dispatcher(d, arch="sm90", limits={"shared_bytes": 232448, "compute_units": 132})
    assert e.value.rule == "registry.binary-missing" and "k1: kernels/sm90/k1.cubin" in str(e.value)


@pytest.mark.parametrize("field,value,where", [
    ("num_warps", "4", "num_warps"), ("num_warps", 0, "num_warps"), ("shared", -1, "shared"),
    ("shared", float("nan"), "shared"), ("resources", {"regs": "many"}, "resources.regs"), ("block_m", "x", "block_m"),
    ("binary", 5, "binary"), ("warp_size", 0, "warp_size"),
])
def test_build_fields_a_launch_reads_are_typed(tmp_path, field, value, where):
    d = _build_dir(tmp_path)
    _edit(d, lambda doc: doc["kernels"][0]["build"].update({field: value}))
    _refused(d, "registry.schema", f"kernels[0].build.{where}")


@pytest.mark.parametrize("mutate,where", [
    (lambda p: p["times_us"].update({k: float("nan") for k in p["times_us"]}), "times_us"),
    (lambda p: p["times_us"].update({k: -1 for k in p["times_us"]}), "times_us"),
    (lambda p: p["times_us"].update({k: 0 for k in p["times_us"]}), "times_us"),
    (lambda p: p.update(batch=0), "batch"),
    (lambda p: p.update(seqlen_q=-512), "seqlen_q"),
    (lambda p: p.update(nhead_q=16, nhead_k=3), "multiple of nhead_k"),
    (lambda p: p["times_us"].update({k: 10 ** 400 for k in p["times_us"]}), "times_us"),
])
def test_a_corrupt_seqtune_point_is_refused_not_used(tmp_path, mutate, where):
    d = _build_dir(tmp_path, n=2, table=True)
    _edit(d, lambda doc: mutate(doc["seqtune"]["classes"][0]["points"][0]))
    _refused(d, "registry.schema", where)


@pytest.mark.parametrize("value", [-1, 0, "132", True])
def test_a_table_device_needs_compute_units_of_one_or_more(tmp_path, value):
    d = _build_dir(tmp_path, n=1, table=True)
    _edit(d, lambda doc: doc["seqtune"]["device"].update(compute_units=value))
    _refused(d, "registry.schema", "compute_units")


@pytest.mark.parametrize("text,fragment", [
    ("[" * 100000 + "]" * 100000, "nest too deeply"),
    ('{"schema_version": 1, "x": ' + "9" * 5000 + "}", "not valid registry JSON"),
])
def test_pathological_json_is_a_registry_error(tmp_path, text, fragment):
    (tmp_path / "registry.json").write_text(text)
    _refused(tmp_path, "registry.json", fragment)


@pytest.mark.parametrize("version", [True, 2.0, 1.0])
def test_schema_version_must_be_an_int(tmp_path, version):
    d = _build_dir(tmp_path)
    _edit(d, lambda doc: doc.update(schema_version=version))
    _refused(d, "registry.schema-version", "not supported")


def test_two_kernels_of_one_name_are_refused(tmp_path):
    d = _build_dir(tmp_path, n=2)
    _edit(d, lambda doc: (doc["kernels"][1].update(name="k0"), doc["kernels"][1]["build"].update(binary=doc[
        "kernels"][0]["build"]["binary"])))
    _refused(d, "registry.duplicate", "two kernels of one name")


def _swap(doc, field):
    a, b = doc["kernels"][0], doc["kernels"][1]
    a[field], b[field] = b[field], a[field]


@pytest.mark.parametrize("edit,says", [
    (lambda doc: _swap(doc, "name"), "is named for another kernel"),       # explain() named the wrong winner
    (lambda doc: _swap(doc, "build"), "is named for another kernel"),      # entry A launched B's binary
    (lambda doc: doc["kernels"][0].update(name="../../x"), "its name is not a file name"),
    (lambda doc: doc["kernels"][0].update(name="a\nb"), "its name is not a file name"),
    (lambda doc: doc["kernels"][0].update(name=""), "its name is not a file name"),
    (lambda doc: doc["kernels"][0]["build"].update(block_m=64), "build.block_m is 64 but its tile's is 128"),
])
def test_an_entry_whose_name_or_build_disagrees_with_its_fields_is_refused(tmp_path, edit, says):
    """The schema let these through; a launch acted on them (a block size off the tile gave NaN in 112 of 256 rows
    through the interpreter, with no error)."""
    d = _build_dir(tmp_path, n=2)
    _edit(d, lambda doc: doc["kernels"][0]["build"].update(block_m=128, block_n=64))   # (the tile's own: loads)
    Registry.load(d)
    _edit(d, edit)
    _refused(d, "registry.build", says)


@pytest.mark.parametrize("edit,says", [
    (lambda doc: doc["statistics"]["by_dtype"].update(fp16=99), "statistics.by_dtype is {'fp16': 99}"),
    (lambda doc: doc["metadata"].update(archs=["gfx950"]), "metadata.archs is ['gfx950'] but the kernels give"),
    (lambda doc: doc["metadata"].update(profiles=["nope"]), "metadata.profiles names 'nope', no profile"),
])
def test_a_head_that_disagrees_with_the_kernels_is_refused(tmp_path, edit, says):
    d = _build_dir(tmp_path, n=2)
    _edit(d, edit)
    _refused(d, "registry.summary", says)


@pytest.mark.parametrize("edit,says", [
    (lambda t: t["classes"][0]["points"].append(t["classes"][0]["points"][0]), "measures a point listed before it"),
    (lambda t: t["classes"].append(t["classes"][0]), "measures a class listed before it"),
    (lambda t: t["classes"][0]["points"][0]["times_us"].update(nope=1.0), "times 'nope', which is no kernel"),
])
def test_a_table_that_measures_twice_or_measures_strangers_is_refused(tmp_path, edit, says):
    """A second copy of a point silently won (explain reported its 100x times); a stranger's time ranked nothing."""
    d = _build_dir(tmp_path, n=2, table=True)
    _edit(d, lambda doc: edit(doc["seqtune"]))
    _refused(d, "registry.seqtune", says)
    _edit(d, lambda doc: doc["seqtune"]["classes"][0]["class"].update(dtype="bogus"))
    _refused(d, "registry.schema", "dtype 'bogus' is none of")


def test_a_key_written_twice_and_files_that_are_no_files_are_refused(tmp_path):
    d = _build_dir(tmp_path)
    text = (d / "registry.json").read_text()
    (d / "registry.json").write_text(text.replace('"schema_version": 1', '"schema_version": 1, "schema_version": 1'))
    _refused(d, "registry.json", "key 'schema_version' appears twice")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    _refused(fifo, "registry.unreadable", "is not a regular file")   # (it blocked forever)
    _refused(os.devnull, "registry.unreadable", "is not a regular file")   # (/dev/zero ran out of memory)


def test_load_accepts_a_build_directory_and_says_what_a_directory_file_is(tmp_path):
    d = _build_dir(tmp_path / "b")
    assert [e.name for e in Registry.load(d)] == ["k0"]
    (tmp_path / "registry.json").mkdir()
    _refused(tmp_path / "registry.json", "registry.unreadable", "is a directory, not a registry file")


def test_damaged_decision_records_are_ignored():
    assert decisions.close_runners_up({"kernel": ["a"], "times_us": {"a": 1.0}}) == []
    assert decisions.close_runners_up({"kernel": "a", "times_us": {"a": 1.0, "b": True, "c": 1.01}}) == ["c"]
    assert decisions.close_runners_up({"kernel": "a", "times_us": {"a": float("nan"), "c": 1.0}}) == []


def test_a_deeply_nested_decision_table_reads_as_damaged(tmp_path):
    t = decisions.TunedTable("sm90", "NVIDIA H200", str(tmp_path), None)
    os.makedirs(os.path.dirname(t.path), exist_ok=True)
    with open(t.path, "w") as f:
        f.write("[" * 100000 + "]" * 100000)
    assert t.get("anything") is None


@pytest.mark.parametrize("mutate", [
    lambda doc: [p["times_us"].clear() for c in doc["seqtune"]["classes"] for p in c["points"]],
    lambda doc: doc["kernels"][0].update(name=5),
    lambda doc: doc["kernels"][0].update(algorithm=[1]),
    lambda doc: doc["kernels"][0]["algorithm"].update(tile=["a", "b"]),
    lambda doc: doc["kernels"][0]["algorithm"].update(pad_s="x"),
])
def test_report_never_crashes_on_what_it_reads(tmp_path, mutate):
    d = _build_dir(tmp_path / "b", n=2, table=True)
    _edit(d, mutate)
    r = subprocess.run([sys.executable, "-m", "fmha_dsl.cli", "report", str(d), "-o", str(tmp_path / "r.html")],
                       capture_output=True, text=True)
    assert r.returncode in (0, 2) and "Traceback" not in r.stderr, r.stderr


def test_the_dispatcher_still_plans_from_a_sound_directory(tmp_path):
    d = _build_dir(tmp_path, n=2, table=True)
    disp = Dispatcher(d, arch="sm90", device_name=DEV["name"], limits={"shared_bytes": 232448, "compute_units": 132})
    assert disp.plan(problem(sq=512)).entry.name == "k0"   # the faster at 512 in the table
    assert disp.binary(disp.entries[0]) == BINARY


def test_a_ck_registry_for_two_archs_repeats_names_across_archs(tmp_path):
    """CK's instance names carry no arch (`..._gfx9`): a build for gfx90a and gfx942 lists each name twice, once
    per arch, and loads (a name may repeat only across archs: its binary is kernels/<arch>/<name>.*)."""
    import fmha_dsl

    reg = fmha_dsl.loads("kernel_set t { arch(gfx90a, gfx942) kernel { signature { family(fwd) dtype(fp16) "
                         "hdim(128) mask(no) lse(false) } } }").registry(arch=["gfx90a", "gfx942"])
    reg.save(tmp_path / "registry.json")
    back = Registry.load(tmp_path)
    names = [e.name for e in back]
    assert len(names) == 2 * len(set(names)) > 0 and {e.arch for e in back} == {"gfx90a", "gfx942"}


def test_a_binary_lost_after_the_directory_was_opened_is_the_directorys_fault(tmp_path):
    d = _build_dir(tmp_path)
    disp = Dispatcher(d, arch="sm90", limits={"shared_bytes": 232448, "compute_units": 132})
    os.remove(d / "kernels/sm90/k0.cubin")
    with pytest.raises(RegistryError) as e:
        disp.binary(disp.entries[0])
    assert e.value.rule == "registry.binary-missing" and "cannot read" in str(e.value)


@pytest.mark.parametrize("value", [True, False])
def test_a_seqtune_time_is_a_number_not_a_flag(tmp_path, value):
    d = _build_dir(tmp_path, n=2, table=True)
    _edit(d, lambda doc: doc["seqtune"]["classes"][0]["points"][0]["times_us"].update(
        {k: value for k in doc["seqtune"]["classes"][0]["points"][0]["times_us"]}))
    _refused(d, "registry.schema", "times_us")


def test_registry_and_dispatcher_calls_with_the_wrong_kind_of_argument(tmp_path):
    from fmha_dsl.errors import UsageError

    reg = Registry.load(_build_dir(tmp_path))
    for call, says in ((lambda: reg.save(5), "Registry.save() takes a file path, got 5"),
                       (lambda: reg.save(None), "Registry.save() takes a file path, got None"),
                       (lambda: Registry.from_json(None), "Registry.from_json() takes the JSON text, got NoneType"),
                       (lambda: Dispatcher(reg, arch="sm91", launcher="interpret"), "unknown arch `sm91`"),
                       (lambda: Dispatcher(reg, arch="sm90", launcher="interpret").select(None),
                        "Dispatcher.select() takes a fmha_dsl.Problem, got NoneType"),
                       (lambda: Dispatcher(reg, arch="sm90", launcher="interpret").explain({"family": "fwd"}),
                        "Dispatcher.explain() takes a fmha_dsl.Problem, got dict")):
        with pytest.raises(UsageError) as e:
            call()
        assert says in str(e.value) and e.value.diagnostics[0].hint, str(e.value)


def test_a_number_of_thousands_of_digits_says_so(tmp_path):
    (tmp_path / "registry.json").write_text('{"schema_version": ' + "9" * 5000 + "}")
    e = _refused(tmp_path, "registry.json", "it holds a number of 5000 digits")
    assert "set_int_max_str_digits" not in str(e)   # (Python's own advice is not the user's fix)


def test_a_filtered_registry_saves_what_it_can_load(tmp_path):
    """filter()/for_arch() keep the whole table in memory (for lookups); what save() writes holds only the kept
    kernels' measurements, so the file loads again."""
    reg = Registry.load(_build_dir(tmp_path / "b", n=2, table=True))
    keep = next(iter(reg)).identifier
    part = reg.filter(lambda e: e.identifier == keep)
    part.save(tmp_path / "part.json")
    back = Registry.load(tmp_path / "part.json")
    assert [e.identifier for e in back] == [keep]
    assert {k for c in back.seqtune["classes"] for p in c["points"] for k in p["times_us"]} == {keep}
    none = reg.for_arch("gfx942")   # no kernel: no measurement (the table keeps its device, as tune writes one)
    none.save(tmp_path / "none.json")
    assert Registry.load(tmp_path / "none.json").seqtune["classes"] == []
    full = tmp_path / "full.json"
    reg.save(full)
    assert full.read_bytes() == (tmp_path / "b" / "registry.json").read_bytes()   # (nothing to prune: unchanged)


def test_registry_json_given_as_bytes_reads_like_text(tmp_path):
    with pytest.raises(RegistryError) as e:
        Registry.from_json(b'{"schema_version": ')
    assert e.value.rule == "registry.json"
    with pytest.raises(RegistryError) as e:
        Registry.from_json(b"\xff\xfe")
    assert e.value.rule == "registry.unreadable"


def test_a_table_with_no_classes_keeps_its_device_when_saved(tmp_path):
    """`fmha-dsl tune` records the device and shape matrix even when it measured nothing new: a table with no
    classes is saved as it is (schema_version 2), not dropped."""
    reg = Registry.load(_build_dir(tmp_path / "b"))
    reg.seqtune = {"classes": [], "device": dict(DEV), "shapes": "default"}
    reg.save(tmp_path / "t.json")
    back = Registry.load(tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text())["schema_version"] == 2
    assert back.seqtune == reg.seqtune
