"""The shape matrix that :func:`fmha_dsl.runtime.tune.tune` measures a build over: read, checked and expanded.

    from fmha_dsl.runtime.tune_shapes import load_shapes, expand_shapes, problem_of
    cls, points = expand_shapes(load_shapes(None))[0]   # the shipped matrix: [(class dict, [point tuples])]
    p = problem_of(cls, points[0])                      # a point as a fmha_dsl.keys.Problem

The format is :mod:`fmha_dsl.runtime.tune`'s (its docstring); a malformed matrix is a located ``UsageError``
(which class, which field, what was expected).  Nothing here touches a GPU.
"""

from __future__ import annotations

import itertools
import json
import os

from fmha_dsl import seqtune
from fmha_dsl.errors import UsageError, error
# FP8_DTYPES: serving classes only (CK's FP8 contract of paged_attention); QSCALES: an FP8 class's descale kinds
from fmha_dsl.kernels.paged_abi import FP8_DTYPES, FP8_QSCALES as QSCALES

from .tune_inputs import SERVING

DEFAULT_SHAPES = os.path.join(os.path.dirname(seqtune.__file__), "data", "seqtune_shapes.json")


def load_shapes(path: str | None = None) -> dict:
    p = path or DEFAULT_SHAPES
    try:
        with open(p, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise error("usage.file", f"cannot read the shape matrix `{p}`: {exc.strerror}", None,
                    "pass --shapes FILE (JSON or YAML)", cls=UsageError) from None
    if p.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise error("usage.dependency", "a YAML shape matrix needs PyYAML", None,
                        "pip install 'fmha-dsl[tune]' (or pass a JSON file)", cls=UsageError) from None
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise error("usage.file", f"`{p}` is not valid YAML: {str(exc).splitlines()[0]}", None,
                        "check the file's indentation and quoting", cls=UsageError) from None
    else:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise error("usage.file", f"`{p}` is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
                        None, "check the brackets and commas there (see fmha_dsl/data/seqtune_shapes.json)",
                        cls=UsageError) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("classes"), list):
        raise error("usage.file", f"`{p}`: a shape matrix is an object with a `classes` list", None,
                    "see fmha_dsl/data/seqtune_shapes.json", cls=UsageError)
    doc.setdefault("name", "default" if path is None else os.path.basename(p))
    expand_shapes(doc, p)  # every class checked here, before any GPU work
    return doc


def _list(v):
    return list(v) if isinstance(v, (list, tuple)) else [v]


_DTYPES = ("fp16", "bf16", "fp32", "fp8bf16")
# (0 and 1 count as False and True)
_MASKS = {"no": "no", "none": "no", False: "no", "causal": "causal", "top_left": "causal", True: "causal"}


_PAGED_KEYS = ("page_size", "lookup", "kv_layout")   # the fields of serving classes only
_CLASS_KEYS = frozenset({"family", "dtype", "hdim", "hdim_q", "hdim_v", "mask", "lse", "nhead_q", "nhead_k", "seqlens",
                         "seqlens_k", "seqlen_k_ratio", "tokens", "batch", "extra_batches", "qscale", *_PAGED_KEYS})
# a class's `family` field -> the problem family it times.  Serving: paged_attention's problem (batch_prefill), whose
# candidates are the batch_prefill kernels and the split-KV fwd_pagedkv kernels with their combine alike (what the
# dispatcher weighs against each other), so `fwd_pagedkv` (decode shapes, by convention) names the same problem
_FAMILIES = {"fwd": "fwd", "bwd": "bwd_dq_dk_dv", "bwd_dq_dk_dv": "bwd_dq_dk_dv", "batch_prefill": "batch_prefill",
             "fwd_pagedkv": "batch_prefill"}
LOOKUPS = ("vllm", "sglang")
KV_LAYOUTS = ("linear", "vectorized")   # tuned cache layouts (PagedCall converts the linear cache it builds)


def _bad(where: str, i: int, what: str, hint: str | None = None) -> UsageError:
    return error("usage.file", f"shape matrix `{where}`, classes[{i}]: {what}", None,
                 hint or "see fmha_dsl/data/seqtune_shapes.json for the format", cls=UsageError)


def _choice(where, i, name, values, allowed, what, hint) -> list:
    from fmha_dsl.errors import did_you_mean

    for v in values:
        if v not in allowed:
            raise _bad(where, i, f"unknown {name} {v!r} ({what})",
                       (did_you_mean(str(v), list(allowed)) if isinstance(v, str) else None) or hint)
    return values


def _caches(where: str, i: int, c: dict, serving: bool) -> list:
    """A serving class's ``(kv_layout, kv_lookup, page_size)`` combinations (``[None]`` for other classes)."""
    if not serving:
        for key in _PAGED_KEYS:
            if key in c:
                raise _bad(where, i, f"`{key}` is a field of serving classes, not of family "
                           f"{c.get('family', 'fwd')!r}", "give it with \"family\": \"batch_prefill\" (prefill) or "
                           "\"fwd_pagedkv\" (decode): paged_attention's problem over a paged KV cache")
        return [None]
    pages = [_pos_int(where, i, "page_size", p) for p in _list(c.get("page_size", 16))]
    for p in pages:
        if p & (p - 1):
            raise _bad(where, i, f"`page_size` must be a power of two, got {p}", "the serving kernels compile "
                       "pages of 1, 2, 4 ... tokens (kernelsets/serving.fmha builds 1, 16 and 1024)")
    lookups = _choice(where, i, "lookup", _list(c.get("lookup", "vllm")), LOOKUPS,
                      "vllm: a block table; sglang: kv_indptr + kv_indices", "use \"lookup\": [\"vllm\", \"sglang\"]")
    layouts = _choice(where, i, "kv_layout", _list(c.get("kv_layout", "linear")), KV_LAYOUTS,
                      f"tuned layouts: {', '.join(KV_LAYOUTS)}", "use \"kv_layout\": \"linear\" ([num_pages, "
                      "page_size, Hk, D] caches) or \"vectorized\" (CK's 16-byte vectors)")
    return list(itertools.product(layouts, lookups, pages))


def _scales(where: str, i: int, c: dict, dtypes: list) -> list:
    """An FP8 class's ``qscale`` values (default per tensor), with None for its other dtypes; ``[None]`` without
    FP8."""
    fp8 = any(dt in FP8_DTYPES for dt in dtypes)
    if "qscale" in c and not fp8:
        raise _bad(where, i, "`qscale` is a field of FP8 classes (dtype fp8bf16)", "add \"dtype\": \"fp8bf16\" or "
                   "drop `qscale`")
    if not fp8:
        return [None]
    scales = _choice(where, i, "qscale", _list(c.get("qscale", "pertensor")), QSCALES,
                     "pertensor: one descale per tensor; kv_blockscale: one per (page, K/V head); per_token_head: "
                     "one per (token, head)", "use \"qscale\": [\"pertensor\", \"kv_blockscale\", \"per_token_head\"]")
    return scales + ([None] if any(dt not in FP8_DTYPES for dt in dtypes) else [])


def _pos_int(where, i, name, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise _bad(where, i, f"`{name}` must be a positive integer, got {v!r}")
    return v


def expand_shapes(doc: dict, where: str = "<shapes>") -> list[tuple[dict, list[tuple]]]:
    """``[(class dict, [point tuples (seqlen_q, seqlen_k, batch, nhead_q, nhead_k)])]``, sorted, deduplicated.

    Every value is checked: a malformed class is a :class:`UsageError` naming the class and the field.
    """
    out: dict[tuple, tuple[dict, set]] = {}
    for i, c in enumerate(doc["classes"]):
        if not isinstance(c, dict):
            raise _bad(where, i, f"a class is an object, got {type(c).__name__}")
        if "seqlens" not in c:
            raise _bad(where, i, "`seqlens` is missing")
        for key in c:
            if key not in _CLASS_KEYS:
                from fmha_dsl.errors import did_you_mean

                hint = did_you_mean(str(key), sorted(_CLASS_KEYS))
                raise _bad(where, i, f"unknown field `{key}`" + (f" ({hint})" if hint else "") +
                           f"; fields: {', '.join(sorted(_CLASS_KEYS))}")
        if "hdim_q" in c:
            hdims = list(zip(_list(c["hdim_q"]), _list(c.get("hdim_v", c["hdim_q"]))))
        else:
            hdims = []
            for h in _list(c.get("hdim", 128)):
                if isinstance(h, (list, tuple)) and len(h) == 2:
                    hdims.append(tuple(h))
                else:
                    hdims.append((h, h))
        hdims = [(_pos_int(where, i, "hdim", dq), _pos_int(where, i, "hdim", dv)) for dq, dv in hdims]
        family = _FAMILIES.get(c.get("family", "fwd")) if isinstance(c.get("family", "fwd"), str) else None
        if family is None:
            raise _bad(where, i, f"unknown family {c['family']!r} (fwd; bwd: the backward's dq_dk_dv kernels; "
                       "batch_prefill or fwd_pagedkv: paged_attention's serving kernels)")
        serving = family in SERVING
        caches = _caches(where, i, c, serving)
        dtypes = _list(c.get("dtype", "bf16"))
        for dt in dtypes:
            if dt not in _DTYPES:
                raise _bad(where, i, f"unknown dtype {dt!r} (one of {', '.join(_DTYPES)})")
            if dt in FP8_DTYPES and not serving:
                raise _bad(where, i, f"dtype {dt} is the serving kernels' FP8 contract, not one of family "
                           f"{c.get('family', 'fwd')!r}", "give it with \"family\": \"batch_prefill\" or "
                           "\"fwd_pagedkv\" (paged_attention over e4m3 caches)")
        scales = _scales(where, i, c, dtypes)
        masks = []
        for m in _list(c.get("mask", "no")):
            if m not in _MASKS:
                raise _bad(where, i, f"unknown mask {m!r} (no or causal)")
            masks.append(_MASKS[m])
        hq = _pos_int(where, i, "nhead_q", c.get("nhead_q", 16))
        hk = _pos_int(where, i, "nhead_k", c.get("nhead_k", hq))
        if hq % hk:
            raise _bad(where, i, f"`nhead_q` ({hq}) must be a multiple of `nhead_k` ({hk}) (GQA/MQA)")
        lses = _list(c.get("lse", False))
        if any(not isinstance(x, bool) for x in lses):
            raise _bad(where, i, f"`lse` must be true/false (or a list of them), got {c['lse']!r}")
        ratio = c.get("seqlen_k_ratio", 1)
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio <= 0:
            raise _bad(where, i, f"`seqlen_k_ratio` must be a positive number, got {ratio!r}")
        seqlens = [_pos_int(where, i, "seqlens", s) for s in _list(c["seqlens"])]
        seqlens_k = [_pos_int(where, i, "seqlens_k", s) for s in _list(c["seqlens_k"])] if "seqlens_k" in c else None
        if seqlens_k is not None and "seqlen_k_ratio" in c:
            raise _bad(where, i, "give `seqlens_k` or `seqlen_k_ratio`, not both")
        tokens = _pos_int(where, i, "tokens", c.get("tokens", 16384))
        fixed = [_pos_int(where, i, "batch", b) for b in _list(c["batch"])] if "batch" in c else None
        extra = [_pos_int(where, i, "extra_batches", b) for b in _list(c.get("extra_batches", []))]
        grid = [(s, sk) for s in seqlens for sk in seqlens_k or [max(1, int(round(s * float(ratio))))]]
        if serving:
            for s, sk in grid:
                if sk < s:
                    raise _bad(where, i, f"seqlen_k {sk} < seqlen_q {s}: a serving point's queries are the last of "
                               "its sequence's seqlen_k cached tokens", "give `seqlens_k` >= every `seqlens` value")
        for dtype, (dq, dv), mask, lse, cache, qscale in itertools.product(dtypes, hdims, masks, lses, caches,
                                                                            scales):
            if (qscale is None) != (dtype not in FP8_DTYPES):
                continue  # (descales belong to the FP8 dtypes of a class that lists others too)
            cls = {"family": family, "dtype": dtype, "mode": "group" if serving else "batch", "vlayout": "r",
                   "hdim_q": dq, "hdim_v": dv, "mask": mask, "bias": "no",
                   "lse": bool(lse) and family != "bwd_dq_dk_dv", "dropout": False, "logits": False, "sink": False}
            if cache is not None:
                cls.update(zip(seqtune.PAGED_FIELDS, cache))
            if qscale is not None:
                cls["qscale"] = qscale
            _, pts = out.setdefault(seqtune.class_key(cls), (cls, set()))
            for s, sk in grid:
                for b in (fixed if fixed is not None else [max(1, tokens // max(s, sk))]) + extra:
                    pts.add((s, sk, b, hq, hk))
    return [(cls, sorted(pts)) for cls, pts in sorted(out.values(), key=lambda cp: json.dumps(cp[0], sort_keys=True))]


def problem_of(cls: dict, pt: tuple, arch: str | None = None):
    """The dispatcher's :class:`~fmha_dsl.keys.Problem` of one point of ``cls``: a serving class's is the problem
    ``fmha_dsl.paged_attention`` builds (group mode, the maxima given, causal bottom-right aligned, the cache's
    layout, table form and page size, an FP8 class's qscale), so its seqtune class is the one the API's selection
    looks up."""
    from fmha_dsl.keys import Problem

    sq, sk, b, hq, hk = pt
    causal = cls["mask"] == "causal"
    kw = {"mask": "top_left" if causal else "no"}
    if cls["family"] in SERVING:
        kw = {"mask": "bottom_right" if causal else "no", "window_right": 0 if causal else -1, "max_seqlen_q": sq,
              "max_seqlen_k": sk, "paged_kv": True, "kv_layout": cls["kv_layout"], "kv_lookup": cls["kv_lookup"],
              "page_size": cls["page_size"]}
        if "qscale" in cls:  # an FP8 class: its descales' granularity
            kw["qscale"] = cls["qscale"]
    return Problem(family=cls["family"], dtype=cls["dtype"], arch=arch, batch=b, nhead_q=hq, nhead_k=hk,
                   seqlen_q=sq, seqlen_k=sk, hdim_q=cls["hdim_q"], hdim_v=cls["hdim_v"], mode=cls["mode"],
                   vlayout=cls["vlayout"], bias=cls["bias"], lse=cls["lse"], dropout=cls["dropout"],
                   logits=cls["logits"], sink=cls["sink"], **kw)


__all__ = ["load_shapes", "expand_shapes", "problem_of", "DEFAULT_SHAPES", "LOOKUPS", "KV_LAYOUTS", "QSCALES"]
