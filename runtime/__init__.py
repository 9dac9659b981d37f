"""Installed as ``fmha_dsl.runtime``: what executes kernels (loading binaries, launching, dispatch).

    from fmha_dsl.runtime import Dispatcher
    disp = Dispatcher("build/bench")            # registry of the current GPU's arch
    plan = disp.plan(problem)                   # fmha_dsl.Problem -> Plan (cached per problem class)
    plan.run(q, k, v, out, lse)

Modules (each imported on first use; importing this package does no work and imports neither lark nor
triton):

``dispatch``   :class:`Dispatcher`, :class:`Plan`: matching, selection, the no-kernel error, launching
``cuda``       cubins through cuda-python's driver API (and Triton's C launcher as an alternative)
``native``     the C launcher (``native_launch.c``), compiled on first use and cached; the default on NVIDIA
``torch_fast`` attention()'s repeat calls replayed in C++ (``torch_fast.cpp``, built in the background on first use)
``cext``       compile, cache and load those two extensions (``native_pack.h``: what their C sources share)
``hip``        hsaco through hip-python (packed kernargs)
``abi``        the kernel-parameter byte layout both use (pure)
``jit``        compile the one kernel a problem needs on first use (imports the build machinery then)
``interpret``  run a selected kernel on the CPU under ``TRITON_INTERPRET=1`` (tests)

At import time this package may import only ``fmha_dsl.keys``, ``fields``, ``registry``, ``errors``,
``keyfields``, ``vocab``, ``reference``, ``knobs`` and ``arch``.
"""

_EXPORTS = {
    "Dispatcher": "dispatch", "Plan": "dispatch", "Stage": "dispatch", "detect_arch": "dispatch",
    "declaration_for": "dispatch", "mismatches": "dispatch",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'fmha_dsl.runtime' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value
