"""The native launcher (runtime/native_launch.c) without a GPU: it is compiled here, and its launch entry point is
a ctypes callback standing in for ``cuLaunchKernel`` that records what it was handed.  The parameter bytes are
checked against :mod:`struct`'s encoding of the same values (an independent encoder)."""

import os
import struct

import pytest

from fakes import FakeDriver

from fmha_dsl.runtime import abi, cext, native

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C compiler on this machine")

@pytest.fixture(scope="module")
def mod():
    return native.load()  # into the test cache (tests/conftest.py sets FMHA_DSL_CACHE_DIR)


def _slot(code, value):
    raw = struct.pack("<" + code, value)
    return raw + b"\0" * (8 - len(raw))


def test_packs_every_kind_like_struct_and_passes_grid_block_shared_stream(mod):
    types = ["*fp16", "i32", "fp32", "i64", "u32", "u64", "i16", "u8", "fp64", "i1"]
    values = [0x7F12_3456_7800, -5, 0.1, -(1 << 40), (1 << 32) - 1, (1 << 64) - 1, -300, 255, 1e300, 1]
    kinds = native.kinds(types)
    assert kinds == b"pifqIQhBdb"
    drv = FakeDriver(len(types) + 2)
    launcher = mod.Launcher(drv.address, 0xABC, 256, 65536, kinds + b"pp", 2)
    assert launcher.launch(7, 16, 3, 0xBEEF, values) == 0
    call = drv.calls[-1]
    assert call["function"] == 0xABC and call["grid"] == (7, 16, 3) and call["block"] == (256, 1, 1)
    assert call["shared"] == 65536 and call["stream"] == 0xBEEF and call["extra"] is None
    codes = [abi.code_of(t)[0] for t in types]
    assert call["slots"][: len(types)] == [_slot(c, v) for c, v in zip(codes, values)]
    assert call["slots"][len(types):] == [b"\0" * 8] * 2  # omitted trailing scratch pointers are NULL


def test_trailing_pointers_may_be_given_and_a_tuple_works(mod):
    drv = FakeDriver(3)
    launcher = mod.Launcher(drv.address, 1, 32, 0, b"ipp", 2)
    launcher.launch(1, 1, 1, 0, (4, 0x1000, 0x2000))
    assert drv.calls[-1]["slots"] == [_slot("i", 4), _slot("Q", 0x1000), _slot("Q", 0x2000)]


def test_returns_the_driver_status(mod):
    drv = FakeDriver(1, status=201)  # CUDA_ERROR_INVALID_CONTEXT
    assert mod.Launcher(drv.address, 1, 32, 0, b"i", 0).launch(1, 1, 1, 0, [0]) == 201


@pytest.mark.parametrize("kinds,args,exc,text", [
    (b"ii", [1, 1 << 31], OverflowError, "kernel argument 1 (kind 'i')"),
    (b"ii", [1, -(1 << 31) - 1], OverflowError, "kernel argument 1"),
    (b"Ip", [-1, 0], OverflowError, "kernel argument 0 (kind 'I')"),
    (b"ip", [0, -8], OverflowError, "kernel argument 1 (kind 'p')"),
    (b"iq", [0, 1 << 63], OverflowError, "kernel argument 1 (kind 'q')"),
    (b"ii", [1, 2.0], TypeError, "not an int"),
    (b"if", [1, "x"], TypeError, "kernel argument 1 (kind 'f'): not a number"),
    (b"ii", [1], TypeError, "takes 2 arguments"),
    (b"ii", [1, 2, 3], TypeError, "takes 2 arguments"),
    (b"ii", 5, TypeError, "list or tuple"),
])
def test_bad_arguments_raise_before_anything_is_launched(mod, kinds, args, exc, text):
    drv = FakeDriver(len(kinds))
    launcher = mod.Launcher(drv.address, 1, 32, 0, kinds, 0)
    with pytest.raises(exc) as info:
        launcher.launch(1, 1, 1, 0, args)
    assert text in str(info.value)
    assert drv.calls == []


@pytest.mark.parametrize("kw,text", [
    (dict(kinds=b"iz"), "unknown parameter kind 'z'"),
    (dict(kinds=b""), "0 parameters"),
    (dict(kinds=b"ii", ntail=3), "3 optional"),
    (dict(function=0), "non-NULL"),
    (dict(kinds=b"i" * 513), "513 parameters"),
])
def test_launcher_construction_is_checked(mod, kw, text):
    args = dict(launch_fn=FakeDriver(1).address, function=1, block=32, shared=0, kinds=b"i", ntail=0)
    args.update(kw)
    with pytest.raises(ValueError, match=text.replace("(", r"\(")):
        mod.Launcher(**args)


def test_grid_out_of_range_is_an_error(mod):
    drv = FakeDriver(1)
    with pytest.raises(OverflowError):
        mod.Launcher(drv.address, 1, 32, 0, b"i", 0).launch(1 << 32, 1, 1, 0, [0])
    assert drv.calls == []


def test_built_once_then_loaded_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FMHA_DSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native, "_STATE", {})
    path, _ = native.library_path()
    assert not os.path.exists(path)
    mod = native.load()
    assert os.path.samefile(mod.__file__, path)
    stat = os.stat(path)
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.setattr(native, "build", lambda *a: pytest.fail("rebuilt a cached launcher"))
    native.load()
    assert os.stat(path).st_mtime_ns == stat.st_mtime_ns
    assert [p for p in os.listdir(os.path.dirname(path)) if p.startswith(".tmp-")] == []


def test_unavailable_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.setenv("FMHA_DSL_NATIVE_LAUNCH", "0")
    ok, why = native.available()
    assert not ok and "FMHA_DSL_NATIVE_LAUNCH=0" in why
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.delenv("FMHA_DSL_NATIVE_LAUNCH")
    monkeypatch.setenv("FMHA_DSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native, "compiler", lambda: None)
    with pytest.raises(native.NativeUnavailable, match="no C compiler"):
        native.load()


def test_a_compile_error_is_reported_not_raised_raw(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.setenv("FMHA_DSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native, "compiler", lambda: ["cc", "--no-such-compiler-flag"])
    with pytest.raises(native.NativeUnavailable, match="compiling the native launcher failed"):
        native.load()
    assert not any(f.startswith(".tmp-") for _, _, fs in os.walk(tmp_path) for f in fs)


def test_an_unwritable_cache_makes_the_launcher_unavailable_not_a_crash(tmp_path, monkeypatch):
    """The runtime then falls back to cuda-python; the reason names the problem."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.setenv("FMHA_DSL_CACHE_DIR", str(blocker / "cache"))
    ok, why = native.available()
    assert not ok and "compiling the native launcher failed" in why


def test_missing_python_headers_are_named(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.setenv("FMHA_DSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cext.sysconfig, "get_paths", lambda: {"include": str(tmp_path / "no-include")})
    ok, why = native.available()
    assert not ok and "Python headers are missing" in why and "python3-dev" in why


def _cuda_h_layout(tmp_path) -> dict | None:
    """Offsets in cuda.h's CUlaunchConfig / CUlaunchAttribute, from the C compiler and the header Triton bundles
    (the truth the hand-written structs in native_launch.c must match); None when either is missing."""
    import subprocess

    try:
        import triton
    except ImportError:
        return None
    inc = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "include")
    if not os.path.exists(os.path.join(inc, "cuda.h")):
        return None
    src = tmp_path / "layout.c"
    src.write_text("""#include <stddef.h>
#include <stdio.h>
#include <cuda.h>
int main(void) {
    printf("%zu %zu %zu %zu %zu %zu %zu %d\\n", offsetof(CUlaunchConfig, sharedMemBytes),
           offsetof(CUlaunchConfig, hStream), offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs),
           sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, value), sizeof(CUlaunchConfig),
           (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
    return 0;
}
""")
    exe = tmp_path / "layout"
    cc = native.compiler()
    if subprocess.run([*cc, "-I", inc, str(src), "-o", str(exe)], capture_output=True).returncode:
        return None
    vals = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True).stdout.split()]
    return dict(zip(("shared", "stream", "attrs", "num_attrs", "attr_size", "attr_value", "size", "serialize"), vals))


def test_the_programmatic_dependent_launch_hands_cuLaunchKernelEx_cuda_h_s_config(mod, tmp_path):
    """after_prior_address(): a cuLaunchKernel-shaped entry point that calls cuLaunchKernelEx (here a ctypes stand-in
    reading the config at cuda.h's offsets) with one attribute: programmatic stream serialization allowed."""
    import ctypes

    want = _cuda_h_layout(tmp_path)
    if want is None:
        pytest.skip("no cuda.h (Triton's bundled headers) to compile against")
    seen = []

    def ex(config, function, params, extra):
        raw = ctypes.string_at(config, want["size"])
        u32 = lambda off: int.from_bytes(raw[off:off + 4], "little")  # noqa: E731
        ptr = lambda off: int.from_bytes(raw[off:off + 8], "little")  # noqa: E731
        attrs, n = ptr(want["attrs"]), u32(want["num_attrs"])
        attr = ctypes.string_at(attrs, want["attr_size"] * n)
        first = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))[0]
        seen.append(dict(grid=tuple(u32(4 * i) for i in range(3)), block=tuple(u32(12 + 4 * i) for i in range(3)),
                         shared=u32(want["shared"]), stream=ptr(want["stream"]), n=n,
                         attr_id=int.from_bytes(attr[:4], "little"),
                         allowed=int.from_bytes(attr[want["attr_value"]:want["attr_value"] + 4], "little"),
                         function=function, slot0=ctypes.string_at(first, 8)))
        return 0

    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    cb = proto(ex)
    addr = mod.after_prior_address(ctypes.cast(cb, ctypes.c_void_p).value)
    try:
        launcher = mod.Launcher(addr, 0xF00, 64, 4096, b"i", 0)
        assert launcher.launch(5, 6, 7, 0xCAFE, [42]) == 0
    finally:  # the entry point is process-wide: hand it back the driver's (a GPU test may launch through it later)
        try:
            mod.after_prior_address(native._driver_symbol("cuLaunchKernelEx"))
        except native.NativeUnavailable:
            pass
    assert seen == [dict(grid=(5, 6, 7), block=(64, 1, 1), shared=4096, stream=0xCAFE, n=1,
                         attr_id=want["serialize"], allowed=1, function=0xF00, slot0=_slot("i", 42))]
    with pytest.raises(ValueError, match="non-NULL"):
        mod.after_prior_address(0)
