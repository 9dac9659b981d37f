"""fmha-dsl: declare, validate, build and dispatch fused multi-head attention kernel sets.

Pipeline (one module per stage, data flowing one way)::

    parse -> declare -> expand (keys + rules) -> registry -> build -> select -> dispatch

Public API (re-exported lazily: importing fmha_dsl does no work)::

    ks = fmha_dsl.load("set.fmha")          # KernelSet
    keys = ks.expand(arch="gfx942")         # list[KernelKey]
    reg = ks.registry(arch="gfx942")        # Registry; reg.save("out/registry.json")
    out = fmha_dsl.attention(q, k, v)       # NumPy: the reference; torch GPU tensors: the kernels (differentiable)
    dq, dk, dv = fmha_dsl.attention_backward(q, k, v, out, lse, dout)
    out = fmha_dsl.paged_attention(q, k_cache, v_cache, block_table=bt, seqlens_k=lens, cu_seqlens_q=cq)
    fmha_dsl.append_kv(k_cache, v_cache, k_new, v_new, block_table=bt, seqlens_k=lens, cu_seqlens_new=cn)
"""

__version__ = "0.1.0"


def _source_checkout_path(package_dir: str) -> list[str]:
    """The repository root when this package runs from a source checkout (``python`` in the repo root, or
    ``pip install -e .``), else nothing.

    The wheel installs the top-level folders ``runtime/``, ``grammar/`` and ``kernelsets/`` as
    ``fmha_dsl.runtime``, ``fmha_dsl.grammar`` and ``fmha_dsl.kernelsets`` (pyproject's ``package-dir``).  In a
    checkout they are siblings of this folder, so the repository root joins ``__path__`` (after the package's own
    folder, so the package's modules always win) and the same import names resolve to the same files.  Only
    ``os.path`` checks: no I/O beyond three ``stat`` calls, nothing imported."""
    import os.path

    root = os.path.dirname(package_dir)
    if os.path.isdir(os.path.join(package_dir, "runtime")):  # an installed wheel: the folders are inside
        return []
    if all(os.path.isfile(os.path.join(root, sub, "__init__.py")) for sub in _CHECKOUT_SUBPACKAGES):
        return [root]
    return []


# the top-level folders of the repository that the wheel installs under this package (pyproject's package-dir)
_CHECKOUT_SUBPACKAGES = ("runtime", "grammar", "kernelsets")
__path__ += _source_checkout_path(__path__[0])  # noqa: F821 (set by the import system)

_EXPORTS = {
    "load": "kernelset", "loads": "kernelset", "shipped": "kernelset", "KernelSet": "kernelset",
    "Signature": "keys", "Algorithm": "keys", "KernelKey": "keys", "Problem": "keys",
    "Registry": "registry", "Entry": "registry",
    "FmhaError": "errors", "ParseError": "errors", "RuleError": "errors", "RegistryError": "errors",
    "UsageError": "errors", "InputError": "errors", "BuildError": "errors", "DispatchError": "errors",
    "InternalError": "errors", "Diagnostic": "errors", "Span": "errors",
    "format_source": "fmt",
    "attention": "attention",
    "attention_backward": "attention_bwd",
    "paged_attention": "paged",
    "append_kv": "paged",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name):
    import importlib

    mod = _EXPORTS.get(name)
    if mod is None:  # a submodule (``fmha_dsl.paged.workspace_numel`` after a plain ``import fmha_dsl``), imported now
        import importlib.util

        try:
            found = name.isidentifier() and not name.startswith("_") and \
                importlib.util.find_spec(f"{__name__}.{name}") is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise AttributeError(f"module 'fmha_dsl' has no attribute {name!r}")
        return importlib.import_module(f"{__name__}.{name}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value
