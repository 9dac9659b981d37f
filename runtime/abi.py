"""Kernel-parameter ABI: how a Triton kernel's run-time arguments are laid out in memory (pure Python).

A Triton kernel compiled ahead of time takes its non-constexpr parameters in declaration order, then two
trailing pointers Triton appends (``global_scratch`` and ``profile_scratch``; NULL when the kernel's scratch
sizes are 0).  Both launch paths use the same byte image:

* CUDA (``cuLaunchKernel(..., kernelParams, ...)``): an array of pointers, entry ``i`` pointing at
  parameter ``i`` inside one packed buffer;
* HIP (``hipModuleLaunchKernel(..., extra=[BUFFER_POINTER, buf, BUFFER_SIZE, &size, END])``): the packed
  buffer is the kernarg segment itself.

Every parameter is naturally aligned (its offset is a multiple of its size), which is what both the CUDA
``kernelParams`` slots and the AMDGPU kernarg segment require.  Nothing here touches a GPU.
"""

from __future__ import annotations

from fmha_dsl.kernels.fwd_abi import ARGS

import struct
from dataclasses import dataclass

# Triton signature type -> (struct code, size).  Pointers ("*fp16", "*i32", ...) are 8-byte addresses.
_SCALARS = {
    "i1": ("b", 1), "i8": ("b", 1), "u8": ("B", 1), "i16": ("h", 2), "u16": ("H", 2),
    "i32": ("i", 4), "u32": ("I", 4), "i64": ("q", 8), "u64": ("Q", 8),
    "fp32": ("f", 4), "f32": ("f", 4), "fp64": ("d", 8),
}
POINTER = ("Q", 8)

# The forward template's run-time parameters, from the Triton-free module the template itself uses;
# Plan loading checks them against the ``params`` a build recorded.
FWD_ARGS: tuple[tuple[str, str], ...] = ARGS
FWD_NAMES: tuple[str, ...] = tuple(n for n, _ in FWD_ARGS)
FWD_TYPES: tuple[str, ...] = tuple(t for _, t in FWD_ARGS)

# Triton appends these after the declared parameters (Triton >= 3.5 on both NVIDIA and AMD)
SCRATCH_PARAMS = ("global_scratch", "profile_scratch")


def code_of(ty: str) -> tuple[str, int]:
    """``(struct code, size)`` of a Triton signature type."""
    if ty.startswith("*"):
        return POINTER
    try:
        return _SCALARS[ty]
    except KeyError:
        raise ValueError(f"unsupported kernel parameter type {ty!r}") from None


@dataclass(frozen=True)
class Layout:
    """Byte layout of a packed parameter buffer.

    ``fmt`` is a little-endian :mod:`struct` format with explicit padding, ``offsets[i]`` the byte offset of
    parameter ``i`` (trailing scratch pointers included), ``size`` the buffer size (a multiple of 8).
    """

    types: tuple[str, ...]
    fmt: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    size: int

    @property
    def count(self) -> int:
        return len(self.offsets)


def layout(types, trailing_pointers: int = 2) -> Layout:
    """Natural-alignment layout of ``types`` followed by ``trailing_pointers`` 8-byte pointers."""
    types = tuple(types) + ("*i8",) * int(trailing_pointers)
    fmt, offsets, sizes, off = ["<"], [], [], 0
    for ty in types:
        code, size = code_of(ty)
        pad = (-off) % size
        if pad:
            fmt.append(f"{pad}x")
            off += pad
        offsets.append(off)
        sizes.append(size)
        fmt.append(code)
        off += size
    total = off + (-off) % 8
    if total > off:
        fmt.append(f"{total - off}x")
    return Layout(types, "".join(fmt), tuple(offsets), tuple(sizes), total)


def pack(lay: Layout, values) -> bytes:
    """The packed buffer for ``values`` (one per parameter of ``lay``, trailing pointers included).

    Pointers are ints (0 = NULL).  Raises ``ValueError`` naming the parameter that does not fit its type.
    """
    values = tuple(values)
    if len(values) != lay.count:
        raise ValueError(f"expected {lay.count} kernel arguments, got {len(values)}")
    try:
        return struct.pack(lay.fmt, *values)
    except struct.error:
        raise _explain(lay, values) from None


def _explain(lay: Layout, values) -> ValueError:
    for i, (ty, val) in enumerate(zip(lay.types, values)):
        code, _ = code_of(ty)
        try:
            struct.pack("<" + code, val)
        except struct.error as exc:
            return ValueError(f"kernel argument {i} ({ty}) = {val!r} does not fit: {exc}")
    return ValueError("kernel arguments do not match the layout")


def fwd_types(dtype: str) -> tuple[str, ...]:
    """FWD_ARGS types for an input dtype (``fp16``/``bf16``/``fp32``)."""
    return tuple(t.format(dtype=dtype) for t in FWD_TYPES)


def check_params(params, expected=FWD_NAMES) -> str | None:
    """Why a build's recorded parameter names differ from what this runtime packs, or None."""
    if not params:
        return None  # older builds recorded nothing: trust the template ABI
    params = tuple(params)
    if params == tuple(expected):
        return None
    for i, (a, b) in enumerate(zip(params, expected)):
        if a != b:
            return f"parameter {i} is {a!r} in the build but {b!r} in this runtime"
    return f"the build has {len(params)} parameters, this runtime packs {len(expected)}"


__all__ = ["FWD_ARGS", "FWD_NAMES", "FWD_TYPES", "SCRATCH_PARAMS", "Layout", "layout", "pack", "code_of", "fwd_types",
           "check_params"]
