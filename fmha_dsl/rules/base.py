"""The contract between the expansion engine and the per-family arch rules.

A family (``fwd``, ``bwd_dq_dk_dv`` ...) is described by one :class:`FamilyRules` object:

* ``fields``: the key fields the family varies, in expansion order (a subset of :data:`ORDER`);
* ``fixed``: fields pinned for the family (e.g. ``rope='none'`` for fwd); any other field the family
  does not vary takes the CK default from :mod:`fmha_dsl.vocab`;
* ``domain(field, b)``: every value a wildcard may take, given the fields bound so far (tile tables,
  head dims per dtype ...);
* ``rules``: small :class:`Rule` predicates, each with a stable id, the fields it reads, a message
  and a hint.  ``filter=True`` marks receipt/profile filters: they drop silently even explicit values;
  any other rule that fails on explicitly requested values is an error located at the setter.
* ``ck_name(b)``: the instance name CK's own generator gives the kernel.

``b`` (bindings) is a plain dict: the environment (``arch``, ``factory``, ``receipt``,
``mask_impl``) plus every field bound so far.  :func:`search` is the engine's core: a depth-first
walk over the fields that checks each rule as soon as its last dependency is bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .. import arch as arch_table
from ..fields import _x

# Expansion order of every key field.  Rules are checked as soon as all their deps are bound,
# so the fields most rules read come first.
ORDER = (
    "dtype", "hdim", "mode", "vlayout", "pipeline", "tile", "pad_s", "pad_sk", "pad_d", "pad_dv",
    "mask", "bias", "logits", "lse", "dropout", "store_randval", "dbias", "deterministic", "qscale",
    "skip", "sink", "trload", "rope", "paged_kv", "fp8_static_quant", "kv_layout", "kv_lookup",
    "page_size", "kv64", "max_splits_log2",
)
ENV = ("arch", "factory", "receipt", "mask_impl", "family", "backend")

# CK factory (arch trait) of each arch: the unit upstream's tables are keyed by (data/archs.json "ck_factory")
FACTORY = arch_table.factories()
ARCH_SUFFIX = {"gfx9": "_gfx9", "gfx950": "_gfx950", "gfx11": "_gfx11", "gfx12": "_gfx12"}


@dataclass(frozen=True)
class Tile:
    """The composite algorithm value drawn from a tile table (or built from explicit setters)."""

    tile: tuple[int, ...]
    wave: tuple[int, ...]
    warp: tuple[int, ...]
    block_per_cu: int = -1
    max_seq_len_q: int = 0
    from_table: bool = True

    def dim(self, key: str) -> int:
        """``tile0``..``tile8``, ``wave0``.., ``warp0``.., ``block_per_cu``, ``max_seq_len_q``; 0 for a dimension
        this kernel's tile does not have (the Triton backward's 1-d stages carry shorter tiles; CK's 0 for an
        untiled dimension), so a ``where`` over tile dimensions reads every family's kernels."""
        if key in ("block_per_cu", "max_seq_len_q"):
            return getattr(self, key)
        kind, idx = key[:4], int(key[4:])
        seq = getattr(self, kind)
        return seq[idx] if idx < len(seq) else 0


@dataclass(frozen=True)
class Rule:
    id: str
    deps: tuple[str, ...]
    check: Callable[[dict], bool]
    message: str | Callable[[dict], str]
    hint: str | Callable[[dict], str] | None = None
    blame: str | None = None
    filter: bool = False

    def text(self, b: dict) -> str:
        return self.message(b) if callable(self.message) else self.message.format(**b)

    def help(self, b: dict) -> str | None:
        """The hint for binding ``b`` (a hint may depend on it, as a message may)."""
        return self.hint(b) if callable(self.hint) else self.hint


@dataclass
class FamilyRules:
    family: str
    fields: tuple[str, ...]
    rules: tuple[Rule, ...]
    domain: Callable[[str, dict], Sequence[Any]]
    ck_name: Callable[[dict], str]
    fixed: dict = field(default_factory=dict)
    # values of varied fields a declaration does not set (instead of CK's default from fmha_dsl.vocab)
    defaults: dict = field(default_factory=dict)
    supported: Callable[[str], str | None] = lambda arch: None   # reason if unsupported, else None
    doc: str = ""

    def __post_init__(self):
        bad = [f for f in self.fields if f not in ORDER]
        if bad:
            raise ValueError(f"{self.family}: unknown fields {bad}")
        self.fields = tuple(f for f in ORDER if f in self.fields)
        known = set(self.fields) | set(ENV) | set(self.fixed)
        for r in self.rules:
            missing = [d for d in r.deps if d not in known]
            if missing:
                raise ValueError(f"rule {r.id}: deps {missing} are not fields of {self.family}")


def schedule(fields: Sequence[str], rules: Sequence[Rule]) -> list[list[Rule]]:
    """For each position in ``fields``, the rules whose last dependency is bound there.

    Rules that depend only on the environment run at position -1 (returned as index len(fields)).
    """
    pos = {f: i for i, f in enumerate(fields)}
    out: list[list[Rule]] = [[] for _ in range(len(fields) + 1)]
    for r in rules:
        idx = max((pos[d] for d in r.deps if d in pos), default=-1)
        out[idx if idx >= 0 else len(fields)].append(r)
    return out


class TooMany(Exception):
    """:func:`search` found more bindings than its ``most``."""


def search(fields: Sequence[str], candidates: Callable[[str, dict], Sequence[Any]],
           plan: list[list[Rule]], env: dict,
           on_fail: Callable[[Rule, dict, str], None] | None = None, most: int | None = None) -> list[dict]:
    """Depth-first walk: every binding of ``fields`` that passes all rules, in walk order.

    ``candidates(field, b)`` lists the values to try; ``on_fail(rule, b, field)`` is told about every
    pruned branch (for drop statistics and explicit-value errors).  Results are collected directly
    (not through nested generators, which would pass each result up through every level).  Past ``most``
    bindings the walk stops with :class:`TooMany` (memory and time stay bounded).
    """
    b = dict(env)
    out: list[dict] = []
    for r in plan[len(fields)]:
        if not r.check(b):
            if on_fail:
                on_fail(r, b, "")
            return out
    n = len(fields)
    if n == 0:
        return [dict(b)]
    last = n - 1
    append = out.append

    def walk(i: int) -> None:
        f = fields[i]
        rules_here = plan[i]
        for v in candidates(f, b):
            b[f] = v
            for r in rules_here:
                if not r.check(b):
                    if on_fail:
                        on_fail(r, b, f)
                    break
            else:
                if i == last:
                    append(dict(b))
                    if most is not None and len(out) > most:
                        raise TooMany
                else:
                    walk(i + 1)
        b.pop(f, None)

    walk(0)
    return out


def enumerate_space(fr: FamilyRules, arch: str, receipt: int = 0, mask_impl: str = "simplified") -> list[dict]:
    """Every binding a family allows on an arch when all its fields are wildcards."""
    env = {"arch": arch, "factory": FACTORY[arch], "receipt": receipt, "mask_impl": mask_impl,
           "family": fr.family, **fr.fixed}
    return list(search(fr.fields, fr.domain, schedule(fr.fields, fr.rules), env))


def pad_token(b: dict, parts: Sequence[tuple[str, str]]) -> str:
    """CK's padding token: ``p`` + the letters of the padded dims, or ``npad``."""
    s = "".join(tok for fld, tok in parts if b.get(fld))
    return "p" + s if s else "npad"


def tf(flag: bool, on: str, off: str | None = None) -> str:
    return on if flag else (off if off is not None else "n" + on)


x = _x  # ``(128, 64, 32)`` -> ``128x64x32`` (cached: the same tiles recur for thousands of kernels)
