"""Ahead-of-time Triton builds on a machine without a GPU: binaries, metadata, cache, failures."""

import hashlib
import json
import os

import pytest

pytest.importorskip("triton")

import fmha_dsl  # noqa: E402
from fmha_dsl.build import build  # noqa: E402

SET = """
kernel_set small {
    backend(triton)
    arch(gfx942, gfx950, sm90)
    kernel k {
        signature { family(fwd) dtype(fp16) mode(batch) hdim(64) mask(causal) lse(true) }
        algorithm { pipeline(qr_async) tile(128, 64, *, *, *, *) wave(4, *, *, *, *, *, *, *, *)
                    padding(true, true, false, false) }
    }
}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("b")
    src = root / "small.fmha"
    src.write_text(SET)
    cache = str(root / "cache")
    ks = fmha_dsl.load(str(src))
    first = build(ks, str(root / "out"), jobs=1, cache_dir=cache)
    return ks, root, cache, first


def test_every_target_compiles_without_a_gpu(built):
    ks, root, cache, res = built
    assert res.failures == []
    assert res.by_arch == {"gfx942": 1, "gfx950": 1, "sm90": 1}
    assert res.compiled == 3 and res.cached == 0


def test_registry_metadata_describes_the_binaries(built):
    ks, root, cache, res = built
    reg = fmha_dsl.Registry.load(str(root / "out" / "registry.json"))
    for e in reg:
        b = e.build
        path = root / "out" / b["binary"]
        data = path.read_bytes()
        assert hashlib.sha256(data).hexdigest() == b["sha256"] and len(data) == b["size"]
        assert b["entry"] and b["num_warps"] == 4 and b["block"][0] == 4 * b["warp_size"]
        assert b["shared"] > 0 and b["block_m"] == 128 and b["params"]
        if e.arch.startswith("gfx"):
            assert path.suffix == ".hsaco" and data[:4] == b"\x7fELF"
            assert b["warp_size"] == 64 and b["resources"]["vgpr"] > 0 and "occupancy" in b["resources"]
        else:
            assert path.suffix == ".cubin" and data[:4] == b"\x7fELF"
            assert b["warp_size"] == 32 and b["resources"].get("regs", 0) > 0
        assert b["template_sha256"] and b["triton"] and b["cache_key"]


def test_rebuild_with_nothing_changed_compiles_nothing(built):
    ks, root, cache, first = built
    again = build(ks, str(root / "out2"), jobs=1, cache_dir=cache)
    assert again.compiled == 0 and again.cached == 3
    a = (root / "out" / "registry.json").read_bytes()
    b = (root / "out2" / "registry.json").read_bytes()
    assert a == b  # byte-identical output from the cache


def test_changed_template_changes_every_cache_key(built, monkeypatch):
    from fmha_dsl import compile_triton as ct

    ks, root, cache, _ = built
    e = next(iter(fmha_dsl.Registry.load(str(root / "out" / "registry.json"))))
    before = ct.cache_parts(e.sig, e.alg, e.arch)
    monkeypatch.setattr(ct, "template_sha256", lambda family="fwd": "0" * 64)
    after = ct.cache_parts(e.sig, e.alg, e.arch)
    assert before["template"] != after["template"]


def _flaky_compile(kind, sig, alg, arch):
    """Stands in for the worker's compile (module level: the spawned workers import it): gfx950 fails."""
    if arch == "gfx950":
        return None, "OutOfResources: shared memory"
    from fmha_dsl.build_triton import _compile_in_worker

    return _compile_in_worker(kind, sig, alg, arch)


def _crashing_compile(kind, sig, alg, arch):
    """A compiler that aborts its process (an LLVM assertion) on gfx950."""
    if arch == "gfx950":
        os.abort()
    from fmha_dsl.build_triton import _compile_in_worker

    return _compile_in_worker(kind, sig, alg, arch)


def _spilling_compile(kind, sig, alg, arch):
    """The real compile, with sm90's resource report claiming spills."""
    from fmha_dsl.build_triton import _compile_in_worker

    meta, data = _compile_in_worker(kind, sig, alg, arch)
    if meta is not None and arch == "sm90":
        meta = dict(meta, resources=dict(meta["resources"], spills=64))
    return meta, data


@pytest.mark.parametrize("jobs", [1, 2])
def test_failures_are_listed_and_the_build_goes_on(built, monkeypatch, jobs):
    from fmha_dsl import build_triton as bt

    ks, root, cache, _ = built
    monkeypatch.setattr(bt, "_compile_in_worker", _flaky_compile)
    res = build(ks, str(root / f"out3-{jobs}"), jobs=jobs, cache_dir=str(root / f"cache-empty-{jobs}"))
    assert [f["arch"] for f in res.failures] == ["gfx950"] and "OutOfResources" in res.failures[0]["reason"]
    assert res.by_arch == {"gfx942": 1, "sm90": 1}
    report = json.loads((root / f"out3-{jobs}" / "build-report.json").read_text())
    assert report["failed"][0]["arch"] == "gfx950"


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_compiler_crash_fails_its_kernel_only(built, monkeypatch, jobs):
    """The compile of one kernel kills its process: that kernel is listed with the signal, the others are built."""
    from fmha_dsl import build_triton as bt

    ks, root, _, _ = built
    monkeypatch.setattr(bt, "_compile_in_worker", _crashing_compile)
    res = build(ks, str(root / f"out-crash-{jobs}"), jobs=jobs, cache_dir=str(root / f"cache-crash-{jobs}"))
    assert [f["arch"] for f in res.failures] == ["gfx950"]
    assert "SIGABRT" in res.failures[0]["reason"] and "compiler crash" in res.failures[0]["reason"]
    assert res.by_arch == {"gfx942": 1, "sm90": 1}
    reg = fmha_dsl.Registry.load(str(root / f"out-crash-{jobs}" / "registry.json"))
    assert sorted(e.arch for e in reg) == ["gfx942", "sm90"]


def test_interrupted_build_resumes_from_the_cache(built):
    ks, root, cache, _ = built
    fresh = str(root / "cache-interrupt")
    calls = []

    def stop_after_first(done, total, failed, cached):
        calls.append(done)
        if done == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build(ks, str(root / "out4"), jobs=1, cache_dir=fresh, progress=stop_after_first)
    assert not os.path.exists(root / "out4" / "registry.json")
    res = build(ks, str(root / "out4"), jobs=1, cache_dir=fresh)
    assert res.cached == 1 and res.compiled == 2


def test_no_spills_drops_spilling_kernels(built, monkeypatch):
    from fmha_dsl import build_triton as bt

    ks, root, cache, _ = built
    monkeypatch.setattr(bt, "_compile_in_worker", _spilling_compile)
    res = build(ks, str(root / "out5"), jobs=1, cache_dir=str(root / "cache-spill"), no_spills=True)
    assert "sm90" not in res.by_arch and res.by_arch == {"gfx942": 1, "gfx950": 1}


def test_profile_is_recorded_like_the_ck_build_and_unwritable_places_are_clear(built, tmp_path):
    """--profile reaches the Triton registry's metadata (as in CK builds); an output folder that cannot be made is a
    usage error before any compile; an unwritable kernel cache only warns (the build still completes)."""
    ks, root, cache, _ = built
    res = build(ks, str(tmp_path / "p"), jobs=1, cache_dir=cache, profile="all")
    assert json.loads(open(res.path).read())["metadata"]["profiles"] == ["all"]
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(fmha_dsl.UsageError) as info:
        build(ks, str(blocker / "out"), jobs=1, cache_dir=cache)
    assert info.value.rule == "usage.output" and "cannot create the output folder" in info.value.message
    assert info.value.hint
    with pytest.warns(RuntimeWarning, match="cannot be written"):
        res = build(ks, str(tmp_path / "q"), jobs=1, cache_dir=str(blocker / "cache"))
    assert res.failures == [] and sum(res.by_arch.values()) == 3


def test_tma_pipeline_compiles_for_sm90_with_global_scratch(tmp_path):
    """pipeline qr_async_trload: on-device tensor descriptors need Triton's global scratch (the runtime allocates
    it per launch), and the binary exists only with the 16-byte alignment promise."""
    from fmha_dsl.compile_triton import compile_key

    ks = fmha_dsl.loads("""
kernel_set t {
    backend(triton) arch(sm90)
    kernel k {
        signature { family(fwd) dtype(bf16) mode(batch) hdim(128) mask(causal) }
        algorithm { pipeline(qr_async_trload) tile(128, 64, *, *, *, *) wave(4, *, *, *, *, *, *, *, *) }
    }
}""", path="t.fmha")
    (e,) = ks.registry(arch="sm90")
    meta, data = compile_key(e.sig, e.alg, "sm90")
    assert meta is not None, data
    assert data[:4] == b"\x7fELF" and meta["num_stages"] == 2 and meta["num_warps"] == 4
    assert meta["global_scratch"] >= 256  # two 128-byte descriptors per program
    assert "K" in meta["aligned"] and "stride_kn" in meta["aligned"]
    none, why = compile_key(e.sig, e.alg, "sm90", aligned=False)
    assert none is None and "aligned" in why


def test_backward_companions_follow_their_key_alignment_and_padding():
    """The dot_do_o and convert_dq stages of an aligned, unpadded backward key promise their ABI's 16-divisible
    arguments and mask the head dim against the key's constant: their whole-row accesses compile to 16-byte
    vectors.  An unaligned key's companions promise nothing (2-byte accesses) and are other binaries."""
    from fmha_dsl import sass as cubin_sass
    from fmha_dsl.build_triton import companion_jobs
    from fmha_dsl.compile_triton import compile_companion
    from fmha_dsl.kernels import bwd_abi

    sig = {"family": "bwd_dq_dk_dv", "dtype": "bf16", "hdim_q": 128, "hdim_v": 128, "mode": "batch",
           "deterministic": False}
    alg = {"pad_d": 0, "pad_dv": 0}
    aligned = {role: (name, key, job) for role, name, key, job in companion_jobs(sig, "sm90", True, alg)}
    plain = {role: (name, key, job) for role, name, key, job in companion_jobs(sig, "sm90", False, alg)}
    padded = {role: (name, key, job) for role, name, key, job in companion_jobs(sig, "sm90", True, {})}
    assert aligned["dot_do_o"][0] == "fmha_bwd_dot_do_o_d128_bf16_batch_npdv_triton_sm90"
    assert plain["convert_dq"][0] == "fmha_bwd_convert_dq_d128_bf16_batch_ndeterministic_npd_unaligned_triton_sm90"
    assert padded["dot_do_o"][0] == "fmha_bwd_dot_do_o_d128_bf16_batch_pdv_triton_sm90"
    for role in ("dot_do_o", "convert_dq"):
        assert len({aligned[role][1], plain[role][1], padded[role][1]}) == 3  # three binaries, three cache keys

    def vectors(job):
        meta, data = compile_companion(job[1], "sm90")
        assert meta is not None, data
        sass = cubin_sass.listing(data)
        # 16-byte vectors, 2-byte loads, and 4-byte ones (the dot stage's one LSE row per thread; O/dO are never
        # read 4 bytes at a time)
        return meta["aligned"], sass.count("LDG.E.128"), sass.count("LDG.E.U16"), sass.count("LDG.E ")

    if not cubin_sass.available():
        pytest.skip("Triton's bundled cuobjdump is missing")
    got, wide, narrow, word = vectors(aligned["dot_do_o"][2])
    assert tuple(got) == bwd_abi.DOT_ALIGNED and wide > 0 and narrow == 0 and word <= 1
    got, wide, narrow, word = vectors(aligned["convert_dq"][2])
    assert tuple(got) == bwd_abi.CONVERT_ALIGNED and wide > 0 and narrow == word == 0
    for job in (plain["dot_do_o"][2], padded["dot_do_o"][2]):
        got, wide, narrow, _ = vectors(job)
        assert wide == 0 and narrow > 0
        assert not got or job is padded["dot_do_o"][2]


def _hot_loop(sass: str) -> int:
    """Instructions of the longest backward-branching loop of a cuobjdump listing (a kernel's key-block loop)."""
    from fmha_dsl.sass import loops

    return max((len(body) for body in loops(sass)), default=0)


@pytest.mark.parametrize("family,tile,extra,over_1024", [("fwd_pagedkv", "16, 128", "max_splits_log2(4)", 1.2),
                                                         ("batch_prefill", "64, 64", "", 1.1)])
def test_a_page_of_16_costs_the_decode_loop_little_more_than_a_page_of_1024(family, tile, extra, over_1024):
    """sm90 decode over a paged cache (the split kernel, and the unsplit GQA-packed 64 x 64 one that first use picks
    at batch 32-128): pages smaller than a key block gather the block row by row, pages of a block or more read it at
    one base.  A 16-token page's table index and slot come from the block's row offsets (compile-time constants per
    thread), K is read in V's layout so that a thread's K and V rows share one page-id load, and the id is clamped by
    one unsigned minimum: the loop stays within 20 % / 10 % of a 1024-token page's and is no longer than a 1-token
    page's, which has no slot at all.  Instructions per key block, Triton 3.6 (page 16 / page 1 / page 1024):
    split 493 / 493 / 429, 64 x 64 415 / 416 / 387 (Triton 3.9: 417 / 416 / 417, 443 / 441 / 416); with K in its own
    layout and a signed clamp (session 18) 589 / 587 / 430 and 504 / 505 / 392, with the slot computed from
    ``start_n + offs_n`` (session 15) 803 for the split kernel."""
    from fmha_dsl import sass as cubin_sass
    from fmha_dsl.compile_triton import compile_key

    if not cubin_sass.available():
        pytest.skip("Triton's bundled cuobjdump is missing")
    ks = fmha_dsl.loads("""
kernel_set d {
    backend(triton) arch(sm90)
    kernel decode {
        signature { family(%s) dtype(bf16) hdim(128) kv_cache(linear, vllm, 1 | 16 | 1024) }
        algorithm { pipeline(qr_nwarp_sshuffle) tile(%s, *, *, *, *) wave(4, *, *, *, *, *, *, *, *)
                    padding(true, true, false, false) %s }
    }
}""" % (family, tile, extra), path="d.fmha")
    loops = {}
    for e in ks.registry(arch="sm90"):
        meta, data = compile_key(e.sig, e.alg, "sm90")
        assert meta is not None, data
        loops[e.sig["page_size"]] = _hot_loop(cubin_sass.listing(data))
    assert set(loops) == {1, 16, 1024} and loops[1024] > 200
    assert loops[16] <= 1.03 * loops[1] and loops[16] <= over_1024 * loops[1024], loops


def test_a_padded_mask_kernel_runs_the_unpadded_kernels_loops():
    """sm90, the 64 x 64 causal kernel: its padded build (``pad_s``, ``pad_sk``) takes the partial last key block out
    of the masked loop and reads Q without a row mask, so both key loops are the unpadded build's (same length, the
    same mask selects) and it needs few more registers.  Triton 3.6: loops 361 / 537 instructions both, 218 registers
    against 201 (3.9: 391 / 566 against 391 / 567, 214 against 202); before (session 26) the masked loop was 632 with
    98 selects against 66, and the padded build took 255 registers."""
    from fmha_dsl import sass as cubin_sass
    from fmha_dsl.compile_triton import compile_key

    if not cubin_sass.available():
        pytest.skip("Triton's bundled cuobjdump is missing")

    def loops(sass):  # (instructions, selects) of each key loop (those with tensor-core work)
        return sorted((len(b), sum("FSEL" in t for t in b)) for b in cubin_sass.loops(sass)
                      if any("HGMMA" in t for t in b))

    got = {}
    for pad in ("false, false, false, false", "true, true, false, false"):
        ks = fmha_dsl.loads("""
kernel_set d {
    backend(triton) arch(sm90)
    kernel k {
        signature { family(fwd) dtype(bf16) hdim(128) mask(causal) mode(batch) }
        algorithm { pipeline(qr_async) tile(64, 64, *, *, *, *) wave(4, *, *, *, *, *, *, *, *) padding(%s) }
    }
}""" % pad, path="d.fmha")
        (e,) = ks.registry(arch="sm90")
        meta, data = compile_key(e.sig, e.alg, "sm90")
        assert meta is not None, data
        got[pad[:4]] = (meta["resources"]["regs"], loops(cubin_sass.listing(data)))
    (r_pad, l_pad), (r_np, l_np) = got["true"], got["fals"]
    assert len(l_pad) == len(l_np) == 2, got
    for (n_pad, sel_pad), (n_np, sel_np) in zip(l_pad, l_np):
        assert abs(n_pad - n_np) <= 0.02 * n_np and sel_pad == sel_np, got
    assert r_pad <= r_np + 32, got


# ---- a backward kernel over the LDS: the bound lets it through, the build fails it ------------------------------
def test_bigger_than_lds_fails_its_build(tmp_path):
    """gfx942 (64 KB of LDS): the 64 x 64 atomic tile fits at d128 (the rule's old estimate dropped it) and builds;
    at d192 x d128 the rule's bound lets it through, the build takes 114,688 bytes and fails it, naming the figure
    (tests/test_expand.py checks the bound against every measured build)."""
    ks = fmha_dsl.loads("""
kernel_set lds {
    backend(triton) arch(gfx942)
    kernel k {
        signature { family(bwd_dq_dk_dv) dtype(fp16) hdim(128) deterministic(false) }
        algorithm { pipeline(bwd_async) tile(64, 64, *, *, *, *, *, *, *) wave(4, *, *, *, *, *, *, *, *)
                    padding(true, true, false, false) }
    }
    kernel k192 {
        signature { family(bwd_dq_dk_dv) dtype(fp16) hdim(192, 128) deterministic(false) }
        algorithm { pipeline(bwd_async) tile(64, 64, *, *, *, *, *, *, *) wave(4, *, *, *, *, *, *, *, *)
                    padding(true, true, false, false) }
    }
}""", path="lds.fmha")
    res = build(ks, str(tmp_path / "out"), jobs=2, cache_dir=str(tmp_path / "cache"))
    assert res.by_arch == {"gfx942": 1}
    (failed,) = res.failures
    assert "d192x128" in failed["name"] and "bytes of shared memory; gfx942 allows 65536" in failed["reason"]
    (e,) = fmha_dsl.Registry.load(str(tmp_path / "out" / "registry.json"))
    assert "d128x128" in e.name and 0 < e.build["shared"] <= 65536


def _failing_compile(kind, sig, alg, arch):
    raise RuntimeError("compiler says no")


def test_a_build_that_keeps_nothing_leaves_the_registry_there_as_it_was(built, monkeypatch):
    """Every kernel failing writes no registry: the one a previous build wrote (with its seqtune table) stays."""
    import shutil

    from fmha_dsl import build_triton as bt

    ks, root, _, first = built
    out = root / "out-keep"
    shutil.copytree(root / "out", out)
    before = (out / "registry.json").read_bytes()
    monkeypatch.setattr(bt, "_compile_in_worker", _failing_compile)
    res = build(ks, str(out), jobs=1, cache_dir=str(root / "cache-fail-all"))
    report = (out / "build-report.json").read_bytes()
    assert res.total == 0 and not res.written and len(res.failures) == 3
    assert (out / "registry.json").read_bytes() == before
    assert (out / "build-report.json").read_bytes() == report   # (the folder's report still describes its registry)


def test_a_rebuild_keeps_the_seqtune_table_of_the_registry_it_replaces(built):
    """`fmha-dsl tune` measured into the build directory; building into it again keeps those measurements."""
    import shutil

    from fmha_dsl.keys import Problem
    from fmha_dsl.seqtune import class_of_problem

    ks, root, cache, _ = built
    out = root / "out-tuned"
    shutil.copytree(root / "out", out)
    reg = fmha_dsl.Registry.load(str(out / "registry.json"))
    name = next(iter(reg)).identifier   # a table names kernels by identifier
    reg.seqtune = {"device": {"name": "NVIDIA H200", "arch": "sm90"}, "shapes": "default",
                   "classes": [{"class": class_of_problem(Problem(family="fwd", dtype="fp16", hdim_q=64,
                                                                  hdim_v=64, mask="top_left", lse=True)),
                                "points": [{"seqlen_q": 1024, "seqlen_k": 1024, "batch": 1, "nhead_q": 16,
                                            "nhead_k": 16, "times_us": {name: 12.5}}]}]}   # (as tune writes it)
    reg.save(str(out / "registry.json"))
    saved = (out / "registry.json").read_bytes()
    assert fmha_dsl.Registry.load(str(out / "registry.json")).seqtune == reg.seqtune
    res = build(ks, str(out), jobs=1, cache_dir=cache)
    assert res.written and res.kept_table and res.dropped_points == 0
    assert (out / "registry.json").read_bytes() == saved   # byte for byte (no `"failed": {}` added)
    fresh = build(ks, str(root / "out-fresh"), jobs=1, cache_dir=cache)
    assert not fresh.kept_table and fmha_dsl.Registry.load(str(root / "out-fresh" / "registry.json")).seqtune is None
    # ... nor when a companion's binary changed (split-KV's combine, the backward's stages: timed with the kernel)
    doc = json.loads((out / "registry.json").read_text())
    for k in doc["kernels"]:
        k["build"]["combine"] = dict({n: v for n, v in k["build"].items() if not isinstance(v, dict)},
                                     cache_key="c" * 64)   # (a well-formed record, of another binary)
    (out / "registry.json").write_text(json.dumps(doc))
    assert not build(ks, str(out), jobs=1, cache_dir=cache).kept_table
    reg.save(str(out / "registry.json"))
    assert build(ks, str(out), jobs=1, cache_dir=cache).kept_table
    # a kernel whose binary changed (another cache key: a new template or Triton) is measured again: not carried
    doc = json.loads((out / "registry.json").read_text())
    for k in doc["kernels"]:
        k["build"]["cache_key"] = "0" * 64
    (out / "registry.json").write_text(json.dumps(doc))
    again = build(ks, str(out), jobs=1, cache_dir=cache)
    assert again.written and not again.kept_table and again.dropped_points == 1   # (said by the CLI)
    assert fmha_dsl.Registry.load(str(out / "registry.json")).seqtune is None


def test_a_registry_a_build_cannot_read_stops_it_before_anything_is_written(built):
    """A tuned registry this version cannot read (a newer schema, a bad hand edit) is not replaced unseen: the build
    stops, and the folder is as it was."""
    import shutil

    from fmha_dsl.errors import UsageError

    ks, root, cache, _ = built
    out = root / "out-unreadable"
    shutil.copytree(root / "out", out)
    doc = json.loads((out / "registry.json").read_text())
    doc["metadata"]["zz_note"] = "hand edit"
    (out / "registry.json").write_text(json.dumps(doc))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(UsageError) as e:
        build(ks, str(out), jobs=1, cache_dir=cache)
    assert e.value.rule == "build.existing-registry" and "zz_note" in str(e.value)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_build_that_fails_while_writing_binaries_leaves_the_old_ones(built, monkeypatch):
    """Binaries are staged and moved into place together, with the registry after them: a write that fails midway
    (a full disk, an interrupt) leaves the folder's registry and the binaries it names as they were."""
    import shutil

    from fmha_dsl import atomic_file
    from fmha_dsl.errors import UsageError

    ks, root, cache, _ = built
    out = root / "out-staged"
    shutil.copytree(root / "out", out)
    for b in (out / "kernels").rglob("*.*"):
        b.write_bytes(b.read_bytes() + b"old")   # (so that a rewrite would show)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    real, calls = atomic_file.write_atomic, []   # (what staging writes each binary with)

    def full_disk(path, data):
        calls.append(path)
        if len(calls) == 2:
            raise UsageError(atomic_file.error("output.write", "cannot write: No space left on device", None,
                                               "free some space").diagnostics)
        return real(path, data)

    monkeypatch.setattr(atomic_file, "write_atomic", full_disk)
    with pytest.raises(UsageError):
        build(ks, str(out), jobs=1, cache_dir=cache)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not list(out.rglob("*.staged.*"))


def test_the_cli_fails_a_build_that_keeps_nothing_even_when_quiet(built, monkeypatch, capsys):
    from fmha_dsl import build_triton as bt
    from fmha_dsl.cli import main

    _, root, _, _ = built
    monkeypatch.setattr(bt, "_compile_in_worker", _failing_compile)
    monkeypatch.setenv("FMHA_DSL_CACHE_DIR", str(root / "cache-cli-fail"))
    assert main(["build", str(root / "small.fmha"), "-o", str(root / "out-cli-fail"), "-j", "1", "-q"]) == 1
    err = capsys.readouterr().err
    assert "no registry written: no kernel was kept (3 failed)" in err and "was not made" in err
    assert not (root / "out-cli-fail" / "registry.json").exists()


def test_a_kernels_folder_linked_to_another_filesystem_is_built_into(built, tmp_path):
    """Binaries are staged beside where they go: `kernels/` a link to another filesystem (a tmpfs) still builds
    (staging in the output folder made every rename cross devices)."""
    import shutil
    import tempfile

    shm = "/dev/shm"
    if not os.path.isdir(shm) or os.stat(shm).st_dev == os.stat(str(tmp_path)).st_dev:
        pytest.skip("no second filesystem to link to")
    ks, root, cache, _ = built
    out = tmp_path / "out-linked"
    shutil.copytree(root / "out", out)
    elsewhere = tempfile.mkdtemp(dir=shm)
    try:
        shutil.rmtree(out / "kernels")
        os.symlink(elsewhere, out / "kernels")
        res = build(ks, str(out), jobs=1, cache_dir=cache)
        assert res.written and res.total
        reg = fmha_dsl.Registry.load(str(out / "registry.json"))
        for e in reg:
            path = os.path.join(elsewhere, os.path.relpath(e.build["binary"], "kernels"))
            with open(path, "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() == e.build["sha256"]
        assert not [n for _, _, files in os.walk(elsewhere) for n in files if ".staged." in n]
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


def test_a_binary_linked_into_a_missing_folder_stops_the_build_and_makes_no_folder(built, tmp_path):
    import shutil

    from fmha_dsl.errors import UsageError

    ks, root, cache, _ = built
    out = tmp_path / "out-dangling"
    shutil.copytree(root / "out", out)
    binary = next(p for p in (out / "kernels").rglob("*") if p.is_file())
    binary.unlink()
    binary.symlink_to(tmp_path / "missing" / "dir" / binary.name)
    with pytest.raises(UsageError) as e:
        build(ks, str(out), jobs=1, cache_dir=cache)
    assert e.value.rule == "output.write" and "whose folder does not exist" in str(e.value)
    assert not (tmp_path / "missing").exists()
