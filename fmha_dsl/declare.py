"""[declare] Setters of a parsed kernel set -> per-field constraints (a :class:`Declaration`).

Each field of a declaration is a :class:`FieldSpec`: explicit values (one, or alternatives), a
wildcard (``*``, optionally narrowed by the explicit parts of a tuple such as ``tile(128, *, ...)``),
or unset (the default applies).  Aliases are canonicalised here; unknown setters, unknown values,
wrong arity and duplicates are located errors.

Modules: :mod:`.declaration` (the result types), :mod:`.declare_values` (argument values), :mod:`.declare_setters`
(the setters) and this one (a parsed file's sets -> declarations: :func:`resolve`).
"""

from __future__ import annotations

from . import ast as A
from .declaration import WILD, Declaration, FieldSpec, TileSpec  # noqa: F401  (re-exported)
from .declare_setters import _apply_setter, _Scope
from .declare_values import _Collector

# ---- kernel sets -> declarations ------------------------------------------------------------------
def _merge(*scopes: _Scope) -> dict:
    out: dict[str, FieldSpec] = {}
    for sc in scopes:
        out.update(sc.fields)
    return out


def _tile_spec(*scopes: _Scope) -> TileSpec:
    dims: dict = {}
    spans: dict = {}
    tile_len = 6
    for sc in scopes:  # later scopes override; named setters override bulk within a scope
        bulk = dict(sc.tile_bulk)
        if bulk:  # a bulk setter in an inner scope replaces the outer bulk values of its kind
            for kind in ("tile", "wave", "warp"):
                if any(k.startswith(kind) for k in bulk if k != "tile_len"):
                    for k in [k for k in dims if k.startswith(kind) and k[len(kind):].isdigit()]:
                        del dims[k]
                    if kind == "tile":
                        dims.pop("wildall", None)  # an outer tile(*) is replaced too
        for k, (vals, sp) in bulk.items():
            if k == "tile_len":
                tile_len = vals[0]
                continue
            dims[k] = vals
            spans[k] = sp
        for k, (vals, sp) in sc.tile_named.items():
            dims[k] = vals
            spans[k] = sp
    wild = any(v is None for v in dims.values())
    dims.pop("wildall", None)
    return TileSpec(dims, spans, wild, tile_len)


def _rules_pick(fields: dict, tile: TileSpec, span) -> tuple[dict, TileSpec]:
    """In a ``kernel { }`` block, an unset pipeline and an unset tile (no tile, wave, warp, block_per_cu or
    max_seq_len_q setter in the kernel or its set) mean ``*``: the rules pick what fits the signature, so
    ``kernel { signature { family(fwd) dtype(bf16) hdim(128) } }`` is a complete declaration.  The C++
    ``.add(FmhaSignature()..., FmhaAlgorithm()...)`` form keeps CK's ``FmhaAlgorithm()`` defaults instead."""
    if "pipeline" not in fields:
        fields = {**fields, "pipeline": FieldSpec(None, span, explicit=False)}
    if not tile.dims:
        tile = TileSpec({}, {}, True, tile.tile_len)
    return fields, tile


def _check_wheres(c: _Collector, wheres) -> None:
    """Compile each where clause now, so that its errors come with the setters' (every error of a file in one
    run), whichever archs a command expands."""
    from .errors import FmhaError
    from .expr import where_rule

    for i, w in enumerate(wheres):
        try:
            where_rule(w, i)
        except FmhaError as exc:
            c.diags.extend(exc.diagnostics)


def resolve(src: A.SourceFile) -> list[Declaration]:
    """All declarations of all kernel sets in one parsed file."""
    c = _Collector()
    decls: list[Declaration] = []
    for ks in src.sets:
        top = _Scope()
        for st in ks.setters:
            _apply_setter(c, top, st, "set")
        _check_wheres(c, ks.wheres)
        if not ks.kernels:
            c.err("set.empty", f"kernel set `{ks.name}` declares no kernels", ks.name_span,
                  "add `kernel { signature { ... } algorithm { ... } }` or `.add(...)`")
        for i, kd in enumerate(ks.kernels):
            sc = _Scope()
            for st in kd.signature:
                _apply_setter(c, sc, st, "signature")
            for st in kd.algorithm:
                _apply_setter(c, sc, st, "algorithm")
            for st in kd.setters:
                _apply_setter(c, sc, st, "kernel")
            _check_wheres(c, kd.wheres)
            archs = sc.archs or top.archs or FieldSpec(("gfx942",), kd.span, explicit=False)
            profile = sc.profile or top.profile or FieldSpec(("ck_default",), kd.span, explicit=False)
            mask_impl = (sc.mask_impl or top.mask_impl or ("simplified", None))[0]
            backend = (sc.backend or top.backend or ("ck", None))[0]
            fields, tile = _merge(top, sc), _tile_spec(top, sc)
            if kd.form == "block":
                fields, tile = _rules_pick(fields, tile, kd.span)
            decls.append(Declaration(
                set_name=ks.name, name=kd.name, index=i, fields=fields, tile=tile,
                archs=archs, profile=profile, mask_impl=mask_impl, backend=backend, wheres=tuple(ks.wheres) + tuple(kd.wheres),
                span=kd.span, path=src.path))
    c.raise_if_any()
    return decls


__all__ = ["FieldSpec", "TileSpec", "Declaration", "resolve", "WILD"]
