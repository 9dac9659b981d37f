"""fmha-dsl: declare, validate, build and dispatch fused multi-head attention kernel sets.

Pipeline (one module per stage, data flowing one way)::

    parse -> declare -> expand (keys + rules) -> registry -> build -> select -> dispatch

Public API (re-exported lazily: importing fmha_dsl does no work)::

    ks = fmha_dsl.load("set.fmha")          # KernelSet
    keys = ks.expand(arch="gfx942")         # list[KernelKey]
    reg = ks.registry(arch="gfx942")        # Registry; reg.save("out/registry.json")
    out = fmha_dsl.attention(q, k, v)       # NumPy: the reference; torch GPU tensors: the kernels
"""

__version__ = "0.1.0"

_EXPORTS = {
    "load": "kernelset", "loads": "kernelset", "shipped": "kernelset", "KernelSet": "kernelset",
    "Signature": "keys", "Algorithm": "keys", "KernelKey": "keys", "Problem": "keys",
    "Registry": "registry", "Entry": "registry",
    "FmhaError": "errors", "ParseError": "errors", "RuleError": "errors", "RegistryError": "errors",
    "UsageError": "errors", "Diagnostic": "errors", "Span": "errors",
    "format_source": "fmt",
    "attention": "attention",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'fmha_dsl' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value
