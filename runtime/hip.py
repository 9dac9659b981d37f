"""Load Triton hsaco code objects and launch them on AMD GPUs through hip-python.

    kernel = load_hsaco(binary, entry="fmha_fwd", shared=32768, num_warps=4, device=0, types=abi.fwd_types("fp16"))
    kernel.launch((gx, gy, gz), args, stream)

The kernel arguments go to ``hipModuleLaunchKernel`` as one packed kernarg buffer through ``extra``::

    extra = [HIP_LAUNCH_PARAM_BUFFER_POINTER, &buf, HIP_LAUNCH_PARAM_BUFFER_SIZE, &size, HIP_LAUNCH_PARAM_END]

The buffer is the declared parameters, each naturally aligned, then Triton's two trailing scratch pointers
(``global_scratch`` and ``profile_scratch``, NULL when their sizes are 0): see :mod:`fmha_dsl.runtime.abi`.
:func:`pack_kernargs` and :func:`extra_words` are pure functions (tested without a GPU); everything that
needs the ROCm runtime raises a clear "ROCm runtime not found" error where it is missing.
"""

from __future__ import annotations

import ctypes
import struct
import threading

from fmha_dsl.errors import UsageError, error

from . import abi

# hip_runtime_api.h: #define HIP_LAUNCH_PARAM_BUFFER_POINTER ((void*)0x01) ... SIZE 0x02, END 0x03
HIP_LAUNCH_PARAM_BUFFER_POINTER = 0x01
HIP_LAUNCH_PARAM_BUFFER_SIZE = 0x02
HIP_LAUNCH_PARAM_END = 0x03

_STATE: dict = {}


def pack_kernargs(types, values, scratch=(0, 0)) -> bytes:
    """The kernarg segment for ``values`` of ``types`` plus the trailing scratch pointers ``scratch``."""
    scratch = tuple(int(p) for p in scratch)
    lay = abi.layout(types, len(scratch))
    return abi.pack(lay, tuple(values) + scratch)


def extra_words(buffer_address: int, size_address: int) -> tuple[int, int, int, int, int]:
    """The five pointer-sized words of ``hipModuleLaunchKernel``'s ``extra`` argument."""
    return (HIP_LAUNCH_PARAM_BUFFER_POINTER, int(buffer_address), HIP_LAUNCH_PARAM_BUFFER_SIZE, int(size_address),
            HIP_LAUNCH_PARAM_END)


class ExtraBlock:
    """A packed kernarg buffer, its size word and the ``extra`` array pointing at both (kept alive together).

    ``address`` is what ``hipModuleLaunchKernel`` takes as ``extra``.  :meth:`pack` rewrites the buffer in
    place, so one block serves every launch of a kernel.
    """

    def __init__(self, lay: abi.Layout):
        self.layout = lay
        self.buffer = ctypes.create_string_buffer(lay.size)
        self.size = ctypes.c_size_t(lay.size)
        words = extra_words(ctypes.addressof(self.buffer), ctypes.addressof(self.size))
        self.extra = (ctypes.c_void_p * 5)(*words)
        self.address = ctypes.addressof(self.extra)
        self._pack_into = struct.Struct(lay.fmt).pack_into

    def pack(self, values) -> None:
        try:
            self._pack_into(self.buffer, 0, *values)
        except struct.error:
            raise error("runtime.args", str(abi._explain(self.layout, tuple(values))), None,
                        "a size or stride does not fit the kernel's 32-bit arguments") from None

    def words(self) -> tuple[int, ...]:
        return tuple(int(w or 0) for w in self.extra)


def hip():
    """hip-python's ``hip`` module with a usable ROCm runtime, or a "ROCm runtime not found" error."""
    h = _STATE.get("hip")
    if h is not None:
        return h
    try:
        from hip import hip as h
    except ImportError:
        raise error("runtime.no-rocm", "ROCm runtime not found: hip-python is not installed", None,
                    "pip install hip-python (and install ROCm) to run kernels on AMD GPUs", cls=UsageError) from None
    try:
        res = h.hipGetDeviceCount()
    except RuntimeError as exc:  # libamdhip64.so missing: hip-python loads it lazily and raises here
        raise error("runtime.no-rocm", f"ROCm runtime not found: {exc}", None,
                    "install ROCm (libamdhip64.so) or set ROCM_PATH; AMD kernels cannot run on this machine",
                    cls=UsageError) from None
    if res[0] != h.hipError_t.hipSuccess or int(res[1]) == 0:
        raise error("runtime.no-rocm", "ROCm runtime found but no AMD GPU is visible", None,
                    "check HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES", cls=UsageError)
    _STATE["hip"] = h
    return h


def check(result, what: str):
    h = hip()
    err = result[0]
    if err != h.hipError_t.hipSuccess:
        try:
            text = h.hipGetErrorString(err)
            text = text.decode() if isinstance(text, bytes) else str(text)
        except Exception:  # noqa: BLE001
            text = ""
        raise error("runtime.hip", f"{what} failed: {err!r} {text}".rstrip(), None,
                    "the hsaco must be built for this GPU's gfx arch" if "Load" in what else None)
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


class HipKernel:
    """A hsaco loaded on one device, launched with a packed kernarg buffer."""

    kind = "hip"
    needs_objects = False

    def __init__(self, binary: bytes, entry: str, shared: int, num_warps: int, warp_size: int, device: int, types,
                 scratch=(0, 0), trailing: int = 2):
        h = hip()
        self.entry, self.device = entry, int(device)
        self.shared, self.block = int(shared), int(num_warps) * int(warp_size)
        check(h.hipSetDevice(self.device), f"hipSetDevice({device})")
        limit = check(h.hipDeviceGetAttribute(h.hipDeviceAttribute_t.hipDeviceAttributeMaxSharedMemoryPerBlock,
                                              self.device), "hipDeviceGetAttribute(MaxSharedMemoryPerBlock)")
        if self.shared > int(limit):
            raise error("runtime.resources", f"kernel {entry} needs {self.shared} bytes of LDS; device {device} "
                        f"allows {limit} per block", None, "use a smaller tile or pipeline qr for this arch")
        self.module = check(h.hipModuleLoadData(binary), f"hipModuleLoadData({entry})")
        self.function = check(h.hipModuleGetFunction(self.module, entry.encode()), f"hipModuleGetFunction({entry!r})")
        if any(int(s) for s in scratch):
            raise error("runtime.scratch", f"kernel {entry} needs scratch memory; the HIP path does not allocate it",
                        None, "rebuild without device-side printing/profiling")
        self.kernargs = ExtraBlock(abi.layout(types, trailing))
        self._tail = (0,) * trailing
        self._launch_fn = h.hipModuleLaunchKernel
        self._ok = h.hipError_t.hipSuccess
        self._lock = threading.Lock()

    def launch(self, grid, args, stream: int = 0) -> None:
        with self._lock:
            self.kernargs.pack(tuple(args) + self._tail)
            err = self._launch_fn(self.function, grid[0], grid[1], grid[2], self.block, 1, 1, self.shared,
                                  stream, None, self.kernargs.address)[0]
        if err != self._ok:
            check((err,), f"hipModuleLaunchKernel({self.entry}, grid={tuple(grid)}, block={self.block})")


def load_hsaco(binary: bytes, *, entry: str, shared: int, num_warps: int, device: int, types, warp_size: int = 64,
               scratch=(0, 0)):
    return HipKernel(binary, entry, shared, num_warps, warp_size, device, types, scratch)


__all__ = ["pack_kernargs", "extra_words", "ExtraBlock", "hip", "HipKernel", "load_hsaco",
           "HIP_LAUNCH_PARAM_BUFFER_POINTER", "HIP_LAUNCH_PARAM_BUFFER_SIZE", "HIP_LAUNCH_PARAM_END"]
