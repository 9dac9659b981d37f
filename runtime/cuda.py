"""Load Triton cubins and launch them on NVIDIA GPUs through cuda-python's driver API.

    kernel = load_cubin(binary, entry="fmha_fwd", shared=49152, num_warps=8, device=0, types=abi.fwd_types("fp16"))
    kernel.launch((gx, gy, gz), args, stream)      # args: the declared parameters, in order

* The module is loaded into the device's *primary* context (``cuDevicePrimaryCtxRetain``), the one the CUDA
  runtime and therefore torch use, so handles, pointers and streams are shared with torch.
* Dynamic shared memory above 48 KiB is opted into with ``cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)``;
  a kernel that needs more than the device allows, or more threads than it can run, fails at load with the
  numbers.
* Parameters are the declared ones plus the trailing ``global_scratch`` / ``profile_scratch`` pointers Triton
  appends (NULL when their sizes are 0).  Where the driver can say (``cuFuncGetParamInfo``, CUDA >= 12.4) the
  binary's parameter count and sizes are checked against that layout at load.
* A launch runs in the context current on the calling thread (torch's, for the tensors' device); if that is
  another device's or none, the launch is retried once with this device's primary context pushed.
* Every driver call's ``CUresult`` is checked; a failure is an :class:`fmha_dsl.errors.FmhaError` (rule
  ``runtime.cuda``) naming the call, the error and what to do.

Three launch paths, same interface (:meth:`launch`):

``"native"``          :class:`NativeKernel`: fmha-dsl's C launcher (:mod:`fmha_dsl.runtime.native`, compiled on
                      first use) converts the arguments and calls ``cuLaunchKernel`` in one C function.
``"cuda"``            :class:`CudaKernel`: the arguments are packed with one precompiled ``struct.pack_into``
                      into a buffer whose slot addresses were computed at load, then cuda-python's
                      ``cuLaunchKernel``.
``"triton"``          :class:`TritonKernel`: the same function handle launched through Triton's own C launcher
                      (``driver.active.launcher_cls``; Triton 3.6 compiles a per-signature C stub once, Triton
                      3.9 uses its generic launcher).  Needs triton at run time.
``"auto"`` (default)  ``native`` where the extension builds (a C compiler and the Python headers), else
                      ``cuda``.

``bench/bench_dispatch.py`` times all three; ``FMHA_DSL_LAUNCHER`` (or ``Dispatcher(..., launcher=...)``)
selects one.
"""

from __future__ import annotations

import ctypes
import struct
import threading

from fmha_dsl.errors import FmhaError, UsageError, error

from . import abi

_INIT_LOCK = threading.Lock()
_STATE: dict = {}  # "driver": module, "init": bool, ("ctx", device): (CUdevice, CUcontext)
SHARED_DEFAULT_LIMIT = 48 * 1024


def driver():
    """cuda-python's driver module (``cuda.bindings.driver``), imported on first use."""
    d = _STATE.get("driver")
    if d is not None:
        return d
    try:
        from cuda.bindings import driver as d
    except ImportError:
        try:  # cuda-python < 12.6 spelled it cuda.cuda
            from cuda import cuda as d  # type: ignore[no-redef]
        except ImportError:
            raise error("runtime.no-cuda-python", "the CUDA runtime path needs cuda-python, which is not installed",
                        None, "pip install cuda-python (or cuda-bindings), or use launcher='triton'",
                        cls=UsageError) from None
    _STATE["driver"] = d
    return d


def _err_text(d, err) -> str:
    try:
        name = d.cuGetErrorName(err)[1]
        text = d.cuGetErrorString(err)[1]
        name = name.decode() if isinstance(name, bytes) else str(name)
        text = text.decode() if isinstance(text, bytes) else str(text)
        return f"{name} ({int(err)}): {text}"
    except Exception:  # noqa: BLE001  (the driver may be unusable)
        return f"CUresult {err!r}"


_HINTS = {
    "CUDA_ERROR_NO_BINARY_FOR_GPU": "the cubin was compiled for another GPU: rebuild for this device's arch",
    "CUDA_ERROR_INVALID_IMAGE": "the binary is not a valid cubin for this driver: rebuild it",
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": "the driver is older than the toolchain that built the cubin",
    "CUDA_ERROR_NOT_FOUND": "the entry name does not exist in the binary (registry and binary disagree)",
    "CUDA_ERROR_INVALID_VALUE": "a launch argument is out of range (grid, block, shared memory, parameters)",
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": "the kernel needs more registers/threads than the device offers",
    "CUDA_ERROR_INVALID_CONTEXT": "no CUDA context is current: touch the device with torch first",
    "CUDA_ERROR_INVALID_HANDLE": "the function belongs to another context/device: set the current device",
    "CUDA_ERROR_NO_DEVICE": "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)",
}


def check(result, what: str):
    """``result`` is a cuda-python return tuple ``(CUresult, *values)``: the values, or an FmhaError."""
    d = driver()
    err = result[0]
    if err != d.CUresult.CUDA_SUCCESS:
        raise failure(err, what)
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def failure(err, what: str) -> FmhaError:
    d = driver()
    text = _err_text(d, err)
    hint = next((h for k, h in _HINTS.items() if text.startswith(k)), None)
    return error("runtime.cuda", f"{what} failed: {text}", None, hint)


def _call(fn, *args, what: str):
    try:
        res = fn(*args)
    except RuntimeError as exc:  # cuda.pathfinder's DynamicLibNotFoundError is a RuntimeError
        raise error("runtime.no-cuda", f"{what}: the NVIDIA driver (libcuda) could not be loaded: {exc}", None,
                    "this needs an NVIDIA GPU with its display driver installed") from None
    return check(res, what)


def primary_context(device: int):
    """``(CUdevice, CUcontext)`` of ``device``'s primary context (retained once per process)."""
    key = ("ctx", int(device))
    got = _STATE.get(key)
    if got is not None:
        return got
    with _INIT_LOCK:
        got = _STATE.get(key)
        if got is not None:
            return got
        d = driver()
        if not _STATE.get("init"):
            _call(d.cuInit, 0, what="cuInit")
            _STATE["init"] = True
        n = _call(d.cuDeviceGetCount, what="cuDeviceGetCount")
        if not 0 <= int(device) < int(n):
            raise error("runtime.cuda", f"CUDA device {device} does not exist ({n} visible)", None,
                        "check CUDA_VISIBLE_DEVICES and the tensors' device", cls=UsageError)
        dev = _call(d.cuDeviceGet, int(device), what="cuDeviceGet")
        ctx = _call(d.cuDevicePrimaryCtxRetain, dev, what="cuDevicePrimaryCtxRetain")
        got = (dev, ctx)
        _STATE[key] = got
        return got


class _Current:
    """Make ``ctx`` current for a block (push/pop only when another context, or none, is current)."""

    def __init__(self, ctx):
        self.ctx, self.pushed = ctx, False

    def __enter__(self):
        d = driver()
        cur = check(d.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if cur is None or int(cur) != int(self.ctx):
            check(d.cuCtxPushCurrent(self.ctx), "cuCtxPushCurrent")
            self.pushed = True
        return self

    def __exit__(self, *exc):
        if self.pushed:
            check(driver().cuCtxPopCurrent(), "cuCtxPopCurrent")


def _param_info(fn):
    """``[(offset, size), ...]`` of the function's parameters, or None when the driver cannot tell."""
    d = driver()
    get = getattr(d, "cuFuncGetParamInfo", None)
    if get is None:
        return None
    out = []
    for i in range(4096):
        try:
            res = get(fn, i)
        except Exception:  # noqa: BLE001  (binding or driver without this entry point)
            return None if i == 0 else out
        if res[0] != d.CUresult.CUDA_SUCCESS:
            if i == 0 and res[0] != d.CUresult.CUDA_ERROR_INVALID_VALUE:
                return None  # e.g. CUDA_ERROR_NOT_SUPPORTED on drivers < 12.4
            return out
        out.append((int(res[1]), int(res[2])))
    return out


def trailing_pointers(info, types) -> int:
    """How many trailing scratch pointers a binary takes, from its parameter info (checked against types)."""
    n = len(types)
    if info is None:
        return 2
    extra = len(info) - n
    if not 0 <= extra <= 2:
        raise error("runtime.abi", f"the binary takes {len(info)} parameters; this runtime passes {n} "
                    f"(+ up to 2 scratch pointers)", None,
                    "the binary was built from another template version: rebuild the registry")
    for i, (ty, (_, size)) in enumerate(zip(types, info)):
        want = abi.code_of(ty)[1]
        if size != want:
            raise error("runtime.abi", f"parameter {i} ({ty}) is {size} bytes in the binary, {want} in this "
                        "runtime", None, "the binary was built from another template version: rebuild it")
    for _, size in info[n:]:
        if size != 8:
            raise error("runtime.abi", "a trailing scratch parameter is not a pointer", None,
                        "unsupported Triton version for ahead-of-time binaries")
    return extra


class LoadedFunction:
    """A cubin loaded on one device: module, function handle and what the launch needs."""

    def __init__(self, binary: bytes, entry: str, shared: int, threads: int, device: int, types):
        d = driver()
        dev, ctx = primary_context(device)
        self.device, self.ctx, self.entry = int(device), ctx, entry
        self.shared, self.threads = int(shared), int(threads)
        self.types = tuple(types)
        with _Current(ctx):
            self.module = check(d.cuModuleLoadData(binary), f"cuModuleLoadData({entry})")
            self.function = check(d.cuModuleGetFunction(self.module, entry.encode()),
                                  f"cuModuleGetFunction({entry!r})")
            fa = d.CUfunction_attribute
            max_threads = check(d.cuFuncGetAttribute(fa.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, self.function),
                                "cuFuncGetAttribute(MAX_THREADS_PER_BLOCK)")
            if self.threads > int(max_threads):
                raise error("runtime.resources", f"kernel {entry} is launched with {self.threads} threads per block "
                            f"but can run at most {max_threads} (register pressure)", None,
                            "use fewer warps or a smaller tile for this kernel")
            self.regs = int(check(d.cuFuncGetAttribute(fa.CU_FUNC_ATTRIBUTE_NUM_REGS, self.function),
                                  "cuFuncGetAttribute(NUM_REGS)"))
            static = int(check(d.cuFuncGetAttribute(fa.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, self.function),
                               "cuFuncGetAttribute(SHARED_SIZE_BYTES)"))
            if self.shared > SHARED_DEFAULT_LIMIT:
                da = d.CUdevice_attribute
                optin = int(check(d.cuDeviceGetAttribute(
                    da.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
                    "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)"))
                if self.shared + static > optin:
                    raise error("runtime.resources", f"kernel {entry} needs {self.shared + static} bytes of shared "
                                f"memory; device {device} allows {optin} per block", None,
                                "use a smaller tile (n0) or fewer stages (pipeline qr) for this device")
                check(d.cuFuncSetAttribute(self.function, fa.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                           self.shared), "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")
            self.trailing = trailing_pointers(_param_info(self.function), self.types)

    @property
    def handle(self) -> int:
        return int(self.function)


class CudaKernel:
    """Launch path 1: ``struct.pack_into`` a preallocated buffer, ``cuLaunchKernel`` with its slot array.

    The buffer is reused (the driver copies the parameters at launch); a lock keeps two threads from packing
    into it at once.  ``scratch`` is ``(global_bytes, profile_bytes)`` per program; non-zero sizes are
    allocated per launch with ``alloc(nbytes, device)`` (returns an object with ``data_ptr()``).
    """

    kind = "cuda"
    needs_objects = False

    def __init__(self, fn: LoadedFunction, block: int, scratch=(0, 0), alloc=None):
        d = driver()
        self.fn = fn
        self._function = fn.function
        self._launch_fn = d.cuLaunchKernel
        self._ok = d.CUresult.CUDA_SUCCESS
        self._stream_cls = d.CUstream
        self._block = int(block)
        self._shared = fn.shared
        self.layout = abi.layout(fn.types, fn.trailing)
        self._buf = ctypes.create_string_buffer(self.layout.size)
        base = ctypes.addressof(self._buf)
        self._slots = (ctypes.c_void_p * self.layout.count)(*[base + o for o in self.layout.offsets])
        self._params = ctypes.addressof(self._slots)
        self._pack_into = struct.Struct(self.layout.fmt).pack_into
        self._tail = (0,) * fn.trailing
        self._scratch = tuple(int(x) for x in scratch)[: fn.trailing]
        self._has_scratch = any(self._scratch)
        self._alloc = alloc
        self._lock = threading.Lock()
        self._streams: dict[int, object] = {}

    def _stream(self, stream: int):
        s = self._stream_cls(stream)
        self._streams[stream] = s
        return s

    def _scratch_tail(self, grid):
        n = grid[0] * grid[1] * grid[2]
        keep, tail = [], []
        for size in self._scratch:
            if size > 0:
                if self._alloc is None:
                    raise error("runtime.scratch", "the kernel needs global scratch memory but no allocator was given")
                t = self._alloc(n * size, self.fn.device)
                keep.append(t)
                tail.append(t.data_ptr())
            else:
                tail.append(0)
        tail += [0] * (self.fn.trailing - len(tail))
        return tuple(tail), keep

    def launch(self, grid, args, stream: int = 0) -> None:
        hs = self._streams.get(stream)
        if hs is None:
            hs = self._stream(stream)
        tail, keep = self._scratch_tail(grid) if self._has_scratch else (self._tail, None)
        with self._lock:
            try:
                self._pack_into(self._buf, 0, *args, *tail)
            except struct.error:
                raise error("runtime.args", str(abi._explain(self.layout, tuple(args) + tail)), None,
                            "a size or stride does not fit the kernel's 32-bit arguments") from None
            err = self._launch_fn(self._function, grid[0], grid[1], grid[2], self._block, 1, 1, self._shared, hs,
                                  self._params, 0)[0]
        if err != self._ok:
            self._retry(err, grid, args, stream, tail)
        del keep  # scratch buffers live until the launch is enqueued (the caching allocator is stream-ordered)

    def _retry(self, err, grid, args, stream, tail):
        """The function belongs to this device's primary context; when another context (another device) or none
        is current on this thread, launch with ours pushed for the call, then restore the caller's."""
        d = driver()
        if err in (d.CUresult.CUDA_ERROR_INVALID_CONTEXT, d.CUresult.CUDA_ERROR_INVALID_HANDLE,
                   d.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED):
            with _Current(self.fn.ctx), self._lock:
                self._pack_into(self._buf, 0, *args, *tail)
                hs = self._streams.get(stream) or self._stream(stream)
                err = self._launch_fn(self._function, grid[0], grid[1], grid[2], self._block, 1, 1, self._shared, hs,
                                      self._params, 0)[0]
            if err == self._ok:
                return
        raise failure(err, f"cuLaunchKernel({self.fn.entry}, grid={tuple(grid)}, block={self._block}, "
                           f"shared={self._shared})")


class NativeKernel(CudaKernel):
    """Launch path 0: the native extension packs and launches in C (scratch, context retries: as CudaKernel).
    ``after_prior``: launched with programmatic dependent launch (the kernel waits for the one before it itself)."""

    kind = "native"

    def __init__(self, fn: LoadedFunction, block: int, scratch=(0, 0), alloc=None, after_prior: bool = False):
        from . import native

        super().__init__(fn, block, scratch, alloc)
        mod = native.load()
        launch = native.after_prior_launch_address() if after_prior else native.driver_launch_address()
        spec = (launch, fn.handle, self._block, fn.shared,
                native.kinds(fn.types) + b"p" * fn.trailing, fn.trailing)
        self._native = mod.Launcher(*spec)
        self._go = self._native.launch
        # what the torch fast path (torch_fast.cpp) needs to replay a launch of this kernel; None: not replayable
        # (per-launch scratch buffers)
        self.fast_spec = None if self._has_scratch else spec

    def launch(self, grid, args, stream: int = 0) -> None:
        if self._has_scratch:
            return super().launch(grid, args, stream)
        try:
            err = self._go(grid[0], grid[1], grid[2], stream, args)
        except (OverflowError, TypeError):
            raise error("runtime.args", str(abi._explain(self.layout, tuple(args) + self._tail)), None,
                        "a size or stride does not fit the kernel's 32-bit arguments") from None
        if err:
            self._retry(err, grid, args, stream, self._tail)


class TritonKernel:
    """Launch path 2: Triton's C launcher (``triton.runtime.driver.active.launcher_cls``) on the same handle."""

    kind = "triton"
    needs_objects = False

    def __init__(self, fn: LoadedFunction, block: int, num_warps: int, scratch=(0, 0), names=None,
                 after_prior: bool = False):
        try:
            from triton.runtime.driver import driver as tdriver
        except ImportError:
            raise error("runtime.no-triton", "launcher='triton' needs Triton at run time", None,
                        "pip install triton, or use the default launcher ('cuda')", cls=UsageError) from None
        from types import SimpleNamespace

        self.fn = fn
        names = list(names or [f"a{i}" for i in range(len(fn.types))])
        src = SimpleNamespace(signature=dict(zip(names, fn.types)), constants={},
                              fn=SimpleNamespace(arg_names=names))
        meta = SimpleNamespace(num_ctas=1, num_warps=int(num_warps), shared=fn.shared,
                               global_scratch_size=int(scratch[0]), global_scratch_align=128,
                               profile_scratch_size=int(scratch[1]) if len(scratch) > 1 else 0,
                               profile_scratch_align=128, launch_cooperative_grid=False, launch_pdl=bool(after_prior),
                               tensordesc_meta=None, instrumentation_mode="")
        self._run = tdriver.active.launcher_cls(src, meta)
        self._packed = (int(num_warps), 1, fn.shared)
        self._handle = fn.handle
        del block

    def launch(self, grid, args, stream: int = 0) -> None:
        try:
            self._run(grid[0], grid[1], grid[2], stream, self._handle, self._packed, None, None, None, *args)
        except (RuntimeError, ValueError, TypeError, OverflowError) as exc:
            raise error("runtime.cuda", f"Triton launcher failed for {self.fn.entry}: {exc}", None,
                        "retry with the default launcher (FMHA_DSL_LAUNCHER=cuda) for a driver error code") from None


def load_cubin(binary: bytes, *, entry: str, shared: int, num_warps: int, device: int, types, warp_size: int = 32,
               launcher: str = "auto", scratch=(0, 0), alloc=None, names=None, after_prior: bool = False):
    """Load ``binary`` on ``device`` and wrap it in the chosen launcher (``auto``, ``native``, ``cuda``,
    ``triton``).  ``after_prior``: the binary waits for the kernel before it (``griddepcontrol.wait``; the build's
    ``after_prior``), so the native and triton launchers launch it with programmatic dependent launch, to overlap
    that kernel's end; the cuda-python fallback launches it plainly (the wait then returns at once)."""
    block = int(num_warps) * int(warp_size)
    fn = LoadedFunction(binary, entry, shared, block, device, types)
    if launcher in ("auto", "native"):
        from .native import NativeUnavailable

        try:
            return NativeKernel(fn, block, scratch, alloc, after_prior)
        except NativeUnavailable as exc:
            if launcher == "native":
                raise error("runtime.native", f"the native launcher is not available: {exc}", None,
                            "use launcher='cuda' (cuda-python), or install a C compiler and the Python headers",
                            cls=UsageError) from None
    if launcher in ("auto", "cuda"):  # auto: the native launcher did not build here
        return CudaKernel(fn, block, scratch, alloc)
    if launcher == "triton":
        return TritonKernel(fn, block, num_warps, scratch, names, after_prior)
    raise error("usage.value", f"unknown launcher {launcher!r}", None, "use 'auto', 'native', 'cuda' or 'triton'",
                cls=UsageError)


__all__ = ["driver", "check", "primary_context", "LoadedFunction", "CudaKernel", "NativeKernel", "TritonKernel",
           "load_cubin", "trailing_pointers"]
