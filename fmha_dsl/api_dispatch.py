"""The dispatchers behind the Python API (one per registry and device, the compile-on-first-use one per device) and
the timer first-use selection measures with.  Shared by :func:`fmha_dsl.attention` and
:func:`fmha_dsl.attention_backward`; importing it does no work."""

from __future__ import annotations

import os

_DISPATCHERS: dict = {}     # registry key -> (Dispatcher, keepalive)
_JIT: dict = {}             # device -> the compile-on-first-use dispatcher
_ARCHS: dict = {}           # device index -> (arch, what the device allows: runtime.device.device_limits)
_CLASS: list = []           # [fmha_dsl.runtime.dispatch.Dispatcher], once imported


def _dispatcher_class():
    from .runtime.dispatch import Dispatcher

    _CLASS.append(Dispatcher)
    return Dispatcher


def dispatcher(registry, dev: int):
    """The dispatcher for ``registry`` on device ``dev`` (made once; a path or a Registry object is the key)."""
    Dispatcher = _CLASS[0] if _CLASS else _dispatcher_class()
    if isinstance(registry, Dispatcher):
        return registry
    fast_key = (registry if isinstance(registry, (str, os.PathLike)) else id(registry), dev)
    got = _DISPATCHERS.get(fast_key)
    if got is not None and (got[1] is registry or isinstance(registry, (str, os.PathLike))):
        return got[0]
    arch, limits = _ARCHS.get(dev) or (None, None)
    if arch is None:  # the device's arch and what it allows (two GPUs of one arch may differ in shared memory)
        from .runtime.device import detect_arch, device_limits

        arch = detect_arch(None if dev < 0 else dev)
        limits = device_limits(arch, dev)
        _ARCHS[dev] = (arch, limits)
    if isinstance(registry, (str, os.PathLike)):
        key = ("path", os.path.abspath(os.fspath(registry)), arch, tuple(sorted(limits.items())))
        got = _DISPATCHERS.get(key)
        if got is None:
            got = _DISPATCHERS[key] = (Dispatcher(registry, arch, limits=limits), registry)
    else:
        builder = None
        if registry is None:
            from .first_use import Builder

            builder = Builder()
        import torch

        name = torch.cuda.get_device_name(dev) if dev >= 0 else None  # the tuned table of *this* device
        got = (Dispatcher(registry, arch, builder=builder, device_name=name, limits=limits), registry)
    _DISPATCHERS[fast_key] = got
    return got[0]


# The timer flushes the L2 by reading a buffer twice its size (clean lines: nothing to write back, however long the
# kernel waits after the flush), and each timed launch waits on the GPU behind a sleep, so that the events time the
# kernels, not the Python path that enqueues them: HOST_SLACK x the host time the plan's previous launch took (at
# most HOST_CAP_US; before a plan has one -- its first launch loads its kernels -- at least HOST_FIRST_US), less the
# least GPU time its timings read where an earlier launch of the same call is still queued ahead of it.  Without the
# sleep a candidate whose launch costs more host time than the flush's GPU time (a split-KV plan: two launches and a
# workspace, 40-110 us) read its host time (decode, batch 1 x 1k keys: 33-114 us for a 10 us plan, which then lost
# to a 16 us one).
HOST_SLACK = 1.5
HOST_CAP_US = 2000.0
HOST_FIRST_US = 200.0
SLEEP_CYCLES_PER_US = 2000   # torch.cuda._sleep spins in clock cycles: at 2 GHz or slower this sleeps long enough


def timer(dev: int, launch):
    """``measure(plan, n=1, warm=0) -> [microseconds] * n``: ``n`` runs of ``launch(plan)`` (a candidate plan on the
    caller's own arguments), each after the L2 cache is flushed and timed by its own events, behind ``warm`` untimed
    flushed runs, all enqueued back to back and read after one synchronisation (what first-use selection compares:
    :func:`fmha_dsl.runtime.race.race`); each timed run behind a GPU sleep that outlasts the host time of its launch
    (:data:`HOST_SLACK`), so that a plan whose Python launch path is slower than its kernels is timed by its kernels.
    None where nothing can be timed (the CPU interpreter, a CUDA graph being captured).  The backward's first use
    times through it too."""
    if dev < 0:
        return None
    import statistics
    import time

    import torch

    if torch.cuda.is_current_stream_capturing():
        return None
    state = {"host": {}, "gpu": {}, "plans": {}}
    sleep = getattr(torch.cuda, "_sleep", None)   # torch's private spin kernel: without it, no sleep

    def flush():
        if "flush" not in state:
            l2 = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or (64 << 20))
            state["flush"] = torch.zeros(l2 // 2, dtype=torch.float32, device=f"cuda:{dev}")   # 2 x L2 bytes
            state["sink"] = torch.empty((), dtype=torch.float32, device=f"cuda:{dev}")
        torch.sum(state["flush"], 0, out=state["sink"])

    def measure(plan, n=1, warm=0):
        host, gpu, key = state["host"], state["gpu"], id(plan)
        seen = key in state["plans"]
        state["plans"][key] = plan   # keeps the plan, so that its id is not reused while this timer lives
        with torch.cuda.device(dev):
            for _ in range(warm):
                flush()
                launch(plan)
                seen = True
            stream = torch.cuda.current_stream(dev)
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
            for i, (t0, t1) in enumerate(ev):
                flush()
                us = host.get(key) or max(HOST_FIRST_US, statistics.median(host.values()) if host else 0.0)
                ahead = gpu.get(key, 0.0) if (i or warm) else 0.0   # a launch of this call still queued ahead
                sleep_us = HOST_SLACK * min(us, HOST_CAP_US) - ahead
                if sleep_us > 0 and sleep is not None:
                    sleep(int(sleep_us * SLEEP_CYCLES_PER_US))
                t0.record(stream)
                h0 = time.perf_counter()
                launch(plan)
                if seen:   # a plan's first launch also loads its kernels: not its host time
                    host[key] = (time.perf_counter() - h0) * 1e6
                seen = True
                t1.record(stream)
            ev[-1][1].synchronize()
        ts = [t0.elapsed_time(t1) * 1000.0 for t0, t1 in ev]
        gpu[key] = min(ts + [gpu.get(key, ts[0])])   # the least it read (a host gap only adds)
        return ts

    return measure


__all__ = ["dispatcher", "timer"]
