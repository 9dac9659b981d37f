"""The device and the registry a dispatcher serves: the registry arch of the current GPU, the GPU's name (which a
seqtune table and the first-use tables are keyed by), what the GPU allows a kernel (its shared memory per block and
its compute units: devices of one arch differ, e.g. an RTX 4090 runs sm80 binaries with 99 KB of shared memory per
block where an A100 has 163 KB), and opening a registry given as an object, a build directory or a
``registry.json`` path.  Importing it does no work (torch is imported when asked)."""

from __future__ import annotations

import os

from fmha_dsl import arch as arch_table
from fmha_dsl.errors import UsageError, error
from fmha_dsl.registry import Registry, registry_path



# ---------------------------------------------------------------------------------------------------------
def detect_arch(device=None) -> str:
    """The registry arch of a torch device: NVIDIA ``sm80`` (any 8.x) / ``sm90``; AMD ``gfxNNN``."""
    try:
        import torch
    except ImportError:
        raise error("dispatch.no-device", "cannot detect the GPU arch: torch is not installed", None,
                    "pass arch='sm90' (or gfx942, ...) explicitly", cls=UsageError) from None
    if not torch.cuda.is_available():
        raise error("dispatch.no-device", "cannot detect the GPU arch: no GPU is visible to torch", None,
                    "pass arch= explicitly, or run on a machine with a GPU", cls=UsageError)
    dev = torch.cuda.current_device() if device is None else device
    if getattr(torch.version, "hip", None):
        name = str(torch.cuda.get_device_properties(dev).gcnArchName)
        return name.split(":")[0]
    major, minor = torch.cuda.get_device_capability(dev)
    arch = arch_table.of_capability(major)   # (fmha_dsl/data/archs.json, read on first use)
    if arch is None:
        raise error("dispatch.no-arch", f"GPU compute capability {major}.{minor} has no kernels in fmha-dsl "
                    f"(it targets {', '.join(sorted(arch_table.by_capability().values()))})", None,
                    "pass arch='sm80' to run sm80 cubins if the device "
                    "can (same major version only)", cls=UsageError)
    return arch


def device_limits(arch: str, device=None) -> dict:
    """What GPU ``device`` (default: the current one) allows, when torch sees it and it is of ``arch``:
    ``{"shared_bytes": shared memory per block (opt-in maximum; NVIDIA only), "compute_units": SMs/CUs}`` (a key is
    left out when the device does not report it); ``{}`` otherwise (the arch table's figures stand:
    :mod:`fmha_dsl.arch`)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return {}
        dev = torch.cuda.current_device() if device is None or device < 0 else device
        if detect_arch(dev) != arch:
            return {}
        props = torch.cuda.get_device_properties(dev)
    except Exception:  # noqa: BLE001  (no usable device: the arch table's figures)
        return {}
    got = {"compute_units": getattr(props, "multi_processor_count", 0)}
    if not getattr(torch.version, "hip", None):  # an AMD arch's LDS is the same on every device of it (arch table)
        got["shared_bytes"] = getattr(props, "shared_memory_per_block_optin", 0)
    return {k: int(v) for k, v in got.items() if isinstance(v, int) and v > 0}


def checked_limits(limits) -> dict:
    """``limits=`` as given to a Dispatcher, checked: what a GPU allows, as :func:`device_limits` reads it."""
    keys = ("shared_bytes", "compute_units")
    bad = (not isinstance(limits, dict) or set(limits) - set(keys)
           or any(type(v) is not int or v < 1 for v in limits.values()))
    if bad:
        raise error("usage.value", f"limits= must be a dict of {' and '.join(keys)} (positive whole numbers), got "
                    f"{limits!r}", None, "e.g. limits={'shared_bytes': 101376, 'compute_units': 128}, or leave it "
                    "out to read them from the device", cls=UsageError)
    return dict(limits)


def over_limits(entry, limits: dict) -> int:
    """The shared memory per block ``entry``'s build (or one of its companion kernels) needs when that is beyond
    ``limits["shared_bytes"]`` (the most of any of its kernels when one does not fit the device), else 0."""
    cap = limits.get("shared_bytes")
    build = getattr(entry, "build", None) or {}
    if not cap or not build:
        return 0
    parts = [build] + [v for v in build.values() if isinstance(v, dict) and "shared" in v]
    need = max(int(b.get("shared") or 0) for b in parts)
    return need if need > cap else 0


def open_registry(registry) -> tuple[Registry, str | None]:
    """``(Registry, root)`` from a Registry, a build directory or a registry.json path (root: where binaries are)."""
    if isinstance(registry, Registry):
        return registry, (os.path.dirname(registry.path) if getattr(registry, "path", None) else None)
    if registry is None:
        return Registry("jit"), None
    if isinstance(registry, (str, os.PathLike)):
        p = registry_path(registry)
        return Registry.load(p), os.path.dirname(os.path.abspath(p))
    raise error("usage.value", f"registry must be a Registry, a build directory or a registry.json path, got "
                f"{type(registry).__name__}", None, "e.g. Dispatcher('build/bench')", cls=UsageError)


def _device_name() -> str | None:
    """The current GPU's name when torch sees one (compared with a seqtune table's), else None."""
    try:
        import torch

        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name())
    except Exception:  # noqa: BLE001  (no device: only the arch is compared)
        return None
    return None


__all__ = ["detect_arch", "device_limits", "checked_limits", "over_limits", "open_registry"]
