"""[declare] The setters: one kernel declaration's (or a set's) setters applied to its scope, field by field,
including the composite ones (``arch``, ``hdim``, the tile/wave/warp groups).
"""

from __future__ import annotations

from . import ast as A
from . import vocab as V
from .declaration import WILD, FieldSpec
from .declare_values import (_bool_value, _Collector, _empty_lists, _enum_value, _flatten, _int_value, _pad_value,
                             _show, _values)
from .errors import Diagnostic, InternalError, Span, did_you_mean

# ---- setters -------------------------------------------------------------------------------------
_BOOL_FIELDS = {"lse", "dropout", "logits", "paged_kv", "fp8_static_quant", "skip", "sink", "dbias",
                "store_randval", "deterministic", "trload", "kv64"}
_ENUM_FIELDS = {"family", "dtype", "mode", "vlayout", "mask", "bias", "qscale", "rope", "pipeline"}
_INT_FIELDS = {"page_size": 1, "num_wave_groups": 1, "max_splits_log2": 0, "selection_rank": None,
               "block_per_cu": None, "max_seq_len_q": 0}


def _bind_args(c: _Collector, st: A.Setter, spec: V.SetterSpec) -> list[A.Arg | None] | None:
    params = spec.params
    bound: list[A.Arg | None] = [None] * len(params)
    pos = 0
    for arg in st.args:
        if arg.name is None:
            if pos >= len(params):
                c.err("setter.arity", f"`{st.name}` takes at most {len(params)} argument(s), got {len(st.args)}",
                      arg.span, f"`{st.name}({', '.join(params)})`")
                return None
            bound[pos] = arg
            pos += 1
        else:
            if arg.name not in params:
                c.err("setter.keyword", f"`{st.name}` has no parameter `{arg.name}`", arg.span,
                      did_you_mean(arg.name, params) or f"parameters: {', '.join(params)}")
                return None
            i = params.index(arg.name)
            if bound[i] is not None:
                c.err("setter.keyword", f"`{arg.name}` given twice", arg.span)
                return None
            bound[i] = arg
    given = sum(1 for b in bound if b is not None)
    if given < spec.required and not (st.args and st.args[0].alt.options[0].kind == "wild"):
        c.err("setter.arity", f"`{st.name}` needs at least {spec.required} argument(s), got {given}", st.span,
              f"`{st.name}({', '.join(params)})`")
        return None
    return bound


class _Scope:
    """Field specs set in one scope (set level or one declaration)."""

    def __init__(self):
        self.fields: dict[str, FieldSpec] = {}
        self.tile_bulk: dict[str, tuple] = {}     # dim -> (values|None, span)
        self.tile_named: dict[str, tuple] = {}
        self.archs: FieldSpec | None = None
        self.profile: FieldSpec | None = None
        self.mask_impl: tuple | None = None
        self.backend: tuple | None = None
        self.seen: dict[str, Span] = {}


def _apply_setter(c: _Collector, sc: _Scope, st: A.Setter, block: str):
    name = st.name
    spec = V.SETTERS.get(name)
    if spec is None:
        c.err("setter.unknown", f"unknown setter `{name}`", st.name_span,
              did_you_mean(name, V.SETTERS.keys()) or "run `fmha-dsl schema setters` for the list")
        return
    if block in ("signature", "algorithm") and spec.block != block and spec.block != "set":
        other = spec.block
        c.err("setter.wrong-block", f"`{name}` is an {other} setter, not a {block} setter", st.name_span,
              f"move `{name}(...)` into `{other} {{ ... }}`")
        return
    if block in ("signature", "algorithm") and spec.block == "set" and name != "profile" and name != "receipt":
        c.err("setter.wrong-block", f"`{name}` belongs to the kernel or kernel set, not inside `{block} {{ }}`",
              st.name_span, f"write `{name}(...)` next to the signature/algorithm blocks")
        return
    if name in sc.seen:
        prev = sc.seen[name]
        c.err("setter.duplicate", f"`{name}` is set twice in this scope (first at line {prev.line})", st.name_span,
              "keep one; use alternatives `a | b` to ask for several values")
        return
    sc.seen[name] = st.name_span
    empty = [v for a in st.args for v in _empty_lists(a.alt)]
    for v in empty:   # (every setter: an empty list would select nothing)
        c.err("value.empty", f"an empty list selects no {'arch' if name == 'arch' else 'value'}", v.span,
              "list the values (`[a, b]`), or use `*` for every value the rules allow")
    if empty:
        return
    if name == "arch":
        _arch(c, sc, st)
        return
    args = _bind_args(c, st, spec)
    if args is None:
        return

    def one(i, conv):
        a = args[i]
        if a is None:
            return None, None
        return _values(c, a.alt, conv), a.span

    if name in _ENUM_FIELDS:
        vals, sp = one(0, lambda v: _enum_value(c, name, v))
        if vals is not False:
            sc.fields[name] = FieldSpec(vals, sp)
    elif name in _BOOL_FIELDS:
        if args[0] is None:
            sc.fields[name] = FieldSpec((True,), st.span)
        else:
            vals, sp = one(0, lambda v: _bool_value(c, name, v))
            if vals is not False:
                sc.fields[name] = FieldSpec(vals, sp)
    elif name in _INT_FIELDS:
        vals, sp = one(0, lambda v: _int_value(c, name, v, _INT_FIELDS[name]))
        if vals is not False:
            if name in ("block_per_cu", "max_seq_len_q"):
                sc.tile_named[name] = (vals, sp)
            elif name == "page_size":
                _page_size(c, sc, vals, sp)
            else:
                sc.fields[name] = FieldSpec(vals, sp)
    elif name == "constraint":
        a = args[0]
        v = _single(c, name, a)
        if v is None:
            return
        if v.kind not in ("str", "name"):
            c.err("value.type", "`constraint` takes a string", v.span)
        else:
            sc.fields["constraint"] = FieldSpec((str(v.value),), a.span)
    elif name == "hdim":
        _hdim(c, sc, st, args)
    elif name == "kv_cache":
        layout, lookup, ps = args
        if layout is not None:
            vals = _values(c, layout.alt, lambda v: _enum_value(c, "kv_layout", v))
            if vals is not False:
                sc.fields["kv_layout"] = FieldSpec(vals, layout.span)
        if lookup is not None:
            vals = _values(c, lookup.alt, lambda v: _enum_value(c, "kv_lookup", v))
            if vals is not False:
                sc.fields["kv_lookup"] = FieldSpec(vals, lookup.span)
        if ps is not None:
            vals = _values(c, ps.alt, lambda v: _int_value(c, "page_size", v, 1))
            if vals is not False:
                _page_size(c, sc, vals, ps.span)
    elif name == "padding":
        pads = ("pad_s", "pad_sk", "pad_d", "pad_dv")
        if len(st.args) == 1 and args[0] is not None and args[0].alt.options[0].kind == "wild" \
                and len(args[0].alt.options) == 1:
            for p in pads:
                sc.fields[p] = FieldSpec(None, args[0].span)
            return
        for p, a in zip(pads, args):
            if a is None:
                continue
            vals = _values(c, a.alt, lambda v, p=p: _pad_value(c, p, v))
            if vals is not False:
                sc.fields[p] = FieldSpec(vals, a.span)
    elif name in ("pad_s", "pad_sk", "pad_d", "pad_dv"):
        vals, sp = one(0, lambda v: _pad_value(c, name, v))
        if vals is not False:
            sc.fields[name] = FieldSpec(vals, sp)
    elif name == "alignments":
        for fld, a in zip(("hdim_q_alignment", "hdim_v_alignment"), args):
            if a is not None:
                vals = _values(c, a.alt, lambda v, f=fld: _int_value(c, f, v, 0))
                if vals is not False:
                    sc.fields[fld] = FieldSpec(vals, a.span)
    elif name in ("tile", "wave", "warp"):
        _bulk(c, sc, st, args, name)
    elif name.startswith(("tile_", "wave_", "warp_")):
        kind, dim = name.split("_", 1)
        idx = (V.TILE_NAMES if kind == "tile" else V.WAVE_NAMES).index(dim)
        vals, sp = one(0, lambda v: _int_value(c, name, v, 0 if kind == "tile" else 1))
        if vals is not False:
            sc.tile_named[f"{kind}{idx}"] = (vals, sp)
    elif name in ("profile", "receipt"):
        if "profile" in sc.seen and "receipt" in sc.seen:
            c.err("setter.duplicate", "set either `profile` or `receipt`, not both", st.name_span,
                  "receipt numbers are aliases of profiles: keep one of the two")
            return
        v = _single(c, name, args[0])
        if v is None:
            return
        if v.kind == "int":
            if v.value not in V.RECEIPT_TO_PROFILE:
                c.err("value.unknown", f"unknown receipt {v.value}", v.span,
                      "known receipts: " + ", ".join(str(r) for r in sorted(V.RECEIPT_TO_PROFILE) if r >= 0))
                return
            sc.profile = FieldSpec((V.RECEIPT_TO_PROFILE[v.value],), v.span)
        elif v.kind in ("name", "str"):
            key = str(v.value)
            key = V.receipt_profile(key) or key
            if key not in V.PROFILES:
                c.err("value.unknown", f"unknown profile `{key}`", v.span,
                      did_you_mean(key, V.PROFILES) or "profiles: " + ", ".join(V.PROFILES))
                return
            sc.profile = FieldSpec((key,), v.span)
        else:
            c.err("value.type", "`profile` takes a profile name or receipt number", v.span)
    elif name in ("mask_impl", "backend"):
        v = _single(c, name, args[0])
        if v is None:
            return
        r = _enum_value(c, name, v)
        if r and r != WILD:
            setattr(sc, name, (r, v.span))
    else:  # a setter in vocab.SETTERS without a handler: our bug
        raise InternalError(Diagnostic("internal.setter", f"no handler for setter {name}"))


def _page_size(c, sc: _Scope, vals, span) -> None:
    """``page_size(...)`` or ``kv_cache(..., page_size)``: one of the two in a scope, as any setter is set once."""
    if "page_size" in sc.fields:
        c.err("setter.duplicate", "the page size is set twice in this scope (by `page_size` and `kv_cache`)", span,
              "keep one: `kv_cache(layout, lookup, page_size)` or `page_size(...)`")
        return
    sc.fields["page_size"] = FieldSpec(vals, span)


def _single(c, name: str, arg: A.Arg):
    """The one value of a setter that takes one (``constraint``, ``profile``, ``mask_impl``, ``backend``), or None
    after a located error for alternatives, a list or a wildcard."""
    opts = arg.alt.options
    if len(opts) == 1 and opts[0].kind not in ("wild", "list", "tuple"):
        return opts[0]
    c.err("value.single", f"`{name}` takes one value, not alternatives, a list or `*`", arg.span,
          f"declare one {name} per kernel set (or per kernel), e.g. `{name}({_example(name)})`")
    return None


def _example(name: str) -> str:
    return {"constraint": '"..."', "profile": "ck_default", "receipt": "0", "mask_impl": "generic",
            "backend": "triton"}.get(name, "...")


def _arch(c, sc: _Scope, st: A.Setter):
    vals, wild, bad = [], False, False
    for a in st.args:  # every bad arch is reported, not only the first
        if a.name is not None:
            c.err("setter.keyword", "`arch` takes arch names, not keywords", a.span)
            bad = True
            continue
        for v in _flatten(a.alt):
            if v.kind == "wild":
                wild = True
            elif v.kind in ("name", "str") and str(v.value) in V.ARCHS:
                if v.value not in vals:
                    vals.append(str(v.value))
            else:
                c.err("value.unknown", f"unknown arch {_show(v)}", v.span,
                      did_you_mean(str(v.value), V.ARCHS) or f"one of: {', '.join(V.ARCHS)}")
                bad = True
    if bad:
        return
    if not st.args:
        c.err("setter.arity", "`arch` needs at least one arch, or `*`", st.span)
        return
    if wild and vals:
        c.err("value.wild-mixed", "`arch(*)` already means every arch", st.span)
        return
    sc.archs = FieldSpec(None if wild else tuple(vals), st.span)


def _hdim(c, sc: _Scope, st: A.Setter, args):
    qa, va = args[0], args[1]
    if qa is None:
        c.err("setter.arity", "`hdim` needs the q head dim", st.span, "hdim(q) or hdim(q, v), e.g. hdim(192, 128)")
        return
    opts: list[tuple] = []
    wild_q = wild_v = False
    q_vals: list = []
    if qa is not None:
        for v in _flatten(qa.alt):
            if v.kind == "wild":
                wild_q = True
            elif v.kind == "int":
                q_vals.append(v.value)
            elif v.kind == "tuple" and len(v.value) == 2:
                pair = []
                for sub in v.value:
                    x = sub.options[0] if len(sub.options) == 1 else None
                    if x is None or x.kind != "int":
                        c.err("value.type", "a head-dim pair is `(hdim_q, hdim_v)` with two integers", v.span)
                        return
                    pair.append(x.value)
                opts.append(tuple(pair))
            else:
                c.err("value.type", f"`hdim` takes integers or (q, v) pairs, got {_show(v)}", v.span,
                      "e.g. hdim(128), hdim(192, 128), hdim([(64, 64), (192, 128)]) or hdim(*)")
                return
    v_vals: list = []
    if va is not None:
        for v in _flatten(va.alt):
            if v.kind == "wild":
                wild_v = True
            elif v.kind == "int":
                v_vals.append(v.value)
            else:
                c.err("value.type", f"hdim_v takes integers, got {_show(v)}", v.span)
                return
        if opts:
            c.err("value.type", "give either (q, v) pairs or hdim(q, v), not both", va.span)
            return
    for h, where in [(h, qa) for h in q_vals + [x for p in opts for x in p]] + [(h, va) for h in v_vals]:
        if h <= 0 or h > 1024:
            c.err("value.range", f"head dim {h} is out of range (1..1024)", where.span)
            return
    sp = qa.span if qa is not None else st.span
    if wild_q or wild_v:
        if opts:
            c.err("value.wild-mixed", "`*` already means every head dim", sp)
            return
        qs, vs = set(q_vals), set(v_vals)
        match = lambda hv, qs=qs, vs=vs, wq=wild_q, wv=wild_v: (wq or hv[0] in qs) and (wv or not vs or hv[1] in vs)
        sc.fields["hdim"] = FieldSpec(None, sp, match=None if (wild_q and (wild_v or not v_vals)) else match)
        return
    pairs = list(opts)
    for q in q_vals:
        for v in (v_vals or [q]):
            if (q, v) not in pairs:
                pairs.append((q, v))
    sc.fields["hdim"] = FieldSpec(tuple(pairs), sp)


def _bulk(c, sc: _Scope, st: A.Setter, args, kind):
    given = [a for a in args if a is not None]
    if kind == "tile" and len(given) == 1 and given[0].alt.options[0].kind == "wild" and len(st.args) == 1:
        for i in range(9):
            sc.tile_bulk[f"tile{i}"] = (None, given[0].span)
        sc.tile_bulk["wildall"] = (None, given[0].span)
        return
    if kind in ("wave", "warp") and len(given) == 1 and given[0].alt.options[0].kind == "wild":
        for i in range(9):
            sc.tile_bulk[f"{kind}{i}"] = (None, given[0].span)
        return
    n = len(st.args)
    if kind == "tile" and n not in (6, 9):
        c.err("setter.arity", f"`tile` takes 6 values (9 for bwd_dq_dk_dv), got {n}", st.span,
              "tile(m0, n0, k0, n1, k1, k0max)")
        return
    if kind in ("wave", "warp") and n not in (3, 6, 9):
        c.err("setter.arity", f"`{kind}` takes 3, 6 or 9 values, got {n}", st.span,
              f"{kind}(m0, n0, k0[, m1, n1, k1[, m2, n2, k2]])")
        return
    for i, a in enumerate(args):
        if a is None:
            continue
        vals = _values(c, a.alt, lambda v: _int_value(c, kind, v, 0 if kind == "tile" else 1))   # (warps: >= 1)
        if vals is not False:
            sc.tile_bulk[f"{kind}{i}"] = (vals, a.span)
    if kind == "tile":
        sc.tile_bulk["tile_len"] = ((n,), st.span)
    else:  # CK's scraper pads short lists: 3 values + (2,2,1,1,1,1) / (32,32,16,16,16,16); 6 values + the last 3
        filler = {"wave": (2, 2, 1, 1, 1, 1), "warp": (32, 32, 16, 16, 16, 16)}[kind]
        rest = filler[n - 3:] if n == 3 else filler[3:] if n == 6 else ()
        for j, val in enumerate(rest):
            sc.tile_bulk.setdefault(f"{kind}{n + j}", ((val,), st.span))
