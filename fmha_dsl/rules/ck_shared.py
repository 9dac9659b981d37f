"""Pieces the CK rule modules share: table look-ups, kernel-name tokens and rule builders.

Upstream's per-operation generators (``codegen/ops/fmha_*.py``) are copies of one another in many
places: the target-prefix ``get_factory``, the fp16/bf16 + fp8 table groups, the fwd-style tile and
pipeline names, and a handful of ``get_*_blobs`` / ``get_pipelines`` checks.  Each is written once
here; the modules pass their family name (and, for table look-ups, their data file's name:
``ck_splitkv``, ``ck_pagedkv`` ...), so rule ids, messages and hints stay those of the family.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

from .. import arch as arch_table
from .. import vocab as V
from ..data import load
from .base import Rule, Tile, pad_token, tf, x

FP16_BF16 = ("fp16", "bf16")
CK_ARCHS = arch_table.backend_archs("ck")
PAD_TOKENS = (("pad_s", "s"), ("pad_sk", "sk"), ("pad_d", "d"), ("pad_dv", "dv"))
PAD_FIELDS = tuple(f for f, _ in PAD_TOKENS)


# ---------------------------------------------------------------------------------------------- table look-ups

def dtype_group(dtype: str) -> str | None:
    """Key of the per-dtype tables: fp16/bf16 share one table; upstream tests `dtype in ["fp8", "bf8"]`."""
    if dtype in FP16_BF16:
        return "fp16_bf16"
    if dtype in ("fp8", "bf8"):
        return "fp8"
    return None


@functools.lru_cache(maxsize=None)
def prefix_factory(name: str, arch: str) -> str | None:
    """Upstream ``get_factory`` of the generator whose tables are ``<name>.json``: the first target
    prefix that matches wins; ``None`` where none does."""
    for prefix, factory in load(name)["factory_by_target_prefix"]["value"]:
        if arch.startswith(prefix):
            return factory
    return None


def group_table(name: str, table: str, dtype: str, default=None):
    """``<name>.json``'s ``table`` entry for the dtype's group (``default`` without one)."""
    g = dtype_group(dtype)
    return load(name)[table].get(g, default) if g else default


def ordered_dtypes(name: str, groups) -> tuple[str, ...]:
    """Dtypes whose group is in ``groups``, in upstream's loop order (FWD_DTYPE_MAP keys)."""
    return tuple(d for d in load(name)["common"]["fwd_dtype_keys"]["value"] if dtype_group(d) in groups)


@functools.lru_cache(maxsize=None)
def table_dtypes(name: str, table: str) -> tuple[str, ...]:
    # loop over FWD_DTYPE_MAP keys; dtypes without a table (a group key of ``table``) are skipped
    return ordered_dtypes(name, {k for k in load(name)[table] if not k.startswith("_")})


@functools.lru_cache(maxsize=None)
def table_hdims(name: str, table: str, dtype: str) -> tuple[tuple[int, int], ...]:
    """Head dims keying the dtype group's entry of ``table``, as (hdim, hdim)."""
    return tuple((int(h), int(h)) for h in group_table(name, table, dtype, {}))


def factory_tiles(name: str, arch: str) -> dict:
    """``<name>.json``'s tile tables of the arch's factory: {dtype group: {hdim: [entry, ...]}}."""
    return load(name)["tiles"].get(prefix_factory(name, arch), {})


@functools.lru_cache(maxsize=None)
def factory_dtypes(name: str, arch: str) -> tuple[str, ...]:
    # get_hdim_tile_size_dict returns None for dtypes without a table -> skipped
    return ordered_dtypes(name, set(factory_tiles(name, arch)))


@functools.lru_cache(maxsize=None)
def square_hdims(name: str, arch: str, dtype: str) -> tuple[tuple[int, int], ...]:
    """Head dims of the factory's table for the dtype, as (hdim, hdim) (the tables are keyed by one)."""
    g = dtype_group(dtype)
    return tuple((int(h), int(h)) for h in factory_tiles(name, arch).get(g, {})) if g else ()


@functools.lru_cache(maxsize=None)
def square_tiles(name: str, arch: str, dtype: str, hdim: tuple[int, int]) -> tuple[Tile, ...]:
    if hdim[0] != hdim[1]:
        return ()
    g = dtype_group(dtype)
    return tuple(table_tile(t) for t in factory_tiles(name, arch).get(g, {}).get(str(hdim[0]), ()))


class PrefixTables:
    """The tables of one generator that picks its factory by target prefix (``<name>.json``).

    Holds only the file's name: nothing is read before the first look-up.  The ``b``-taking methods
    serve as rule and domain callables.
    """

    def __init__(self, name: str):
        self.name = name

    def factory(self, arch: str) -> str | None:
        """Upstream ``get_factory``: the first target prefix that matches wins (None: unsupported)."""
        return prefix_factory(self.name, arch)

    def pipes(self, dtype: str) -> dict | None:
        """get_pipelines' description for the dtype's group."""
        return group_table(self.name, "pipelines", dtype)

    def loop(self, dtype: str, key: str) -> list:
        """The values a get_pipelines loop takes for the dtype; none without pipelines."""
        p = self.pipes(dtype)
        return p["loop"][key] if p else []

    def dtypes(self, b: dict) -> tuple[str, ...]:
        return factory_dtypes(self.name, b["arch"])

    def hdims(self, b: dict) -> tuple[tuple[int, int], ...]:
        return square_hdims(self.name, b["arch"], b["dtype"])

    def tiles(self, b: dict) -> tuple[Tile, ...]:
        return square_tiles(self.name, b["arch"], b["dtype"], b["hdim"])

    def unsupported(self, family: str, arch: str, missing: str) -> str | None:
        return unsupported_reason(family, arch, self.factory(arch), missing)


def table_tile(t: dict) -> Tile:
    """A fwd-style table entry as a Tile (6-element wave/warp padded with CK's (1,1,1) / (16,16,16))."""
    return Tile(tuple(t["tile"]), tuple(t["wave"]) + (1, 1, 1), tuple(t["warp"]) + (16, 16, 16), t["block_per_cu"])


def pads(b: dict) -> tuple[int, int, int, int]:
    return (b["pad_s"], b["pad_sk"], b["pad_d"], b["pad_dv"])


# ---------------------------------------------------------------------------------------------- domains / names

def mask_domain(mask_impl: str) -> tuple[str, ...]:
    # cpp_symbol_map.get_mask_map: simplified {s_no, s_mask}; generic {no, causal, generic}
    return ("no", "top_left") if mask_impl == "simplified" else ("no", "top_left", "generic")


def fwd_domain(field: str, b: dict, dtypes: Callable[[dict], Sequence], hdims: Callable[[dict], Sequence],
               tiles: Callable[[dict], Sequence]):
    """A forward-style family's domain: dtype / hdim / tile from its tables, the shared value sets of
    the other fields; anything else is an on/off flag (logits, lse, sink, paged_kv, fp8_static_quant ...)."""
    if field == "dtype":
        return dtypes(b)
    if field == "hdim":
        return hdims(b)
    if field == "tile":
        return tiles(b)
    if field == "mode":
        return V.MODES
    if field == "vlayout":
        return V.VLAYOUTS
    if field in PAD_FIELDS:
        return (0, 1)
    if field == "mask":
        return mask_domain(b["mask_impl"])
    if field == "bias":
        return V.BIASES
    if field == "rope":
        return V.ROPES
    return (False, True)


def mask_token(b: dict) -> str:
    # Fwd/bwd kernel names: simplified -> nmask / mask; generic -> nmask / mc (causal) / mg (generic)
    if b["mask"] == "no":
        return "nmask"
    if b["mask_impl"] == "simplified":
        return "mask"
    return "mg" if b["mask"] == "generic" else "mc"


def bias_token(bias: str) -> str:
    return "nbias" if bias == "no" else bias


def tile_token(t: Tile) -> str:
    # FmhaFwdTileSize.name: b{tile}_r{wave gemm0}_r{wave gemm1}_w{warp gemm0}_w{warp gemm1}[_o{occupancy}]
    s = f"b{x(t.tile)}_r{x(t.wave[0:3])}_r{x(t.wave[3:6])}_w{x(t.warp[0:3])}_w{x(t.warp[3:6])}"
    return s if t.block_per_cu == -1 else f"{s}_o{t.block_per_cu}"


def fwd_kernel_name(kernel: str, b: dict, flags: Sequence[tuple[str, str]], suffix: str) -> str:
    """FmhaFwdKernel.name + FmhaFwdPipeline.name of the split-KV / paged-KV generators: the common head,
    then ``_`` + one on/off token per ``(field, token)`` of ``flags``, then the file suffix."""
    head = (f"fmha_{kernel}_d{b['hdim'][0]}_{b['dtype']}_{b['mode']}_{tile_token(b['tile'])}_{b['pipeline']}"
            f"_v{b['vlayout']}_{pad_token(b, PAD_TOKENS)}_{tf(b['logits'], 'logits')}_{bias_token(b['bias'])}"
            f"_{mask_token(b)}")
    return head + "".join(f"_{tf(b[f], tok)}" for f, tok in flags) + suffix


def profile_text(b: dict) -> str:
    r = b["receipt"]
    return f"profile {V.RECEIPT_TO_PROFILE.get(r, r)} (receipt {r})"


def unsupported_reason(family: str, arch: str, factory: str | None, missing: str) -> str | None:
    """Why ``family`` has no kernels on ``arch``: not an AMD target, or no factory (``missing`` says so)."""
    if arch not in CK_ARCHS:
        return f"{family} is not supported on {arch} (CK is AMD only)"
    if factory is None:
        return f"{family} is not supported on {arch} ({missing})"
    return None


# ---------------------------------------------------------------------------------------------- rule builders

def no_logits_with_bias(b: dict) -> bool:
    """Logits soft-cap only without bias (every forward-style generator's check)."""
    return not b["logits"] or b["bias"] == "no"


def dtype_rule(family: str, dtypes: Callable[[dict], Sequence[str]], hint: str, on_arch: bool = True) -> Rule:
    """``ck.<family>.dtype``: the dtype has a tile table (on the arch's factory when ``on_arch``)."""
    def message(b):
        return f"{family} has no {b['dtype']} kernels" + (f" on {b['arch']}" if on_arch else "")
    return Rule(f"ck.{family}.dtype", ("dtype", "arch") if on_arch else ("dtype",),
                lambda b: b["dtype"] in dtypes(b), message, hint=hint, blame="dtype")


def hdim_rule(family: str, hdims: Callable[[dict], Sequence[tuple[int, int]]], on_arch: bool = True) -> Rule:
    """``ck.<family>.hdim``: the head dims of the dtype's table (square: hdim_q = hdim_v)."""
    def message(b):
        where = f" on {b['arch']}" if on_arch else ""
        return (f"{family} has no {b['dtype']} kernels for hdim {b['hdim']}{where}"
                f" (head dims: {', '.join(str(h[0]) for h in hdims(b))})")
    return Rule(f"ck.{family}.hdim", ("dtype", "hdim", "arch") if on_arch else ("dtype", "hdim"),
                lambda b: b["hdim"] in hdims(b), message,
                hint="pick one of the listed head dims (hdim_q = hdim_v)", blame="hdim")


def row_major_v(family: str, check: Callable[[dict], bool] | None = None,
                deps: tuple[str, ...] = ("vlayout",)) -> Rule:
    """``ck.<family>.row-major-v``: get_pipelines lists row-major V only."""
    return Rule(f"ck.{family}.row-major-v", deps, check or (lambda b: b["vlayout"] == "r"),
                f"{family} kernels only support row-major V", hint="use vlayout(r)", blame="vlayout")


def pad_variants(family: str, variants: Callable[[dict], Sequence], with_pipeline: bool) -> Rule:
    """``ck.<family>.pad-variants``: (vlayout, (s, sk, d, dv)) is one get_pipelines instantiates;
    ``variants(b)`` gives those pairs (for the bound pipeline when ``with_pipeline``)."""
    def message(b):
        what = f"{b['dtype']} {b['pipeline']}" if with_pipeline else b["dtype"]
        listed = ", ".join("(" + ", ".join(map(str, p)) + ")" for p in sorted(p for _, p in variants(b)))
        return f"{family} {what} kernels come only with padding (s, sk, d, dv) in {listed or 'none'}"
    deps = ("dtype", "pipeline") if with_pipeline else ("dtype",)
    return Rule(f"ck.{family}.pad-variants", deps + ("vlayout",) + PAD_FIELDS,
                lambda b: (b["vlayout"], pads(b)) in variants(b), message,
                hint="pick one of the listed padding combinations", blame="pad_s")


def group_mode_pads(family: str, needs: tuple[str, ...] = ("pad_s", "pad_sk"),
                    hint: str = "use padding(1, 1, ...) or batch mode") -> Rule:
    """``ck.<family>.group-mode-pads``: "in group mode, spad[/skpad] must be true"."""
    return Rule(f"ck.{family}.group-mode-pads", ("mode",) + needs,
                lambda b: b["mode"] != "group" or all(b[p] for p in needs),
                f"group-mode {family} kernels need seqlen padding ({' and '.join(needs)})",
                hint=hint, blame="mode")


def logits_without_bias(family: str) -> Rule:
    """``ck.<family>.logits-without-bias``: "logits_soft_cap is only allowed if no bias"."""
    return Rule(f"ck.{family}.logits-without-bias", ("bias", "logits"), no_logits_with_bias,
                f"logits soft-cap cannot be combined with bias in {family} kernels",
                hint="drop `logits` or use bias(no)", blame="logits")


def loop_rule(family: str, field: str, loop: Callable[[str, str], Sequence]) -> Rule:
    """``ck.<family>.<field>``: the values get_pipelines loops ``field`` over for the dtype
    (``loop(dtype, field)``; fp8 loops sink / pagedkv / lse over ["f"] only)."""
    noun = field.replace("_", "-")
    return Rule(f"ck.{family}.{noun}", ("dtype", field),
                lambda b: b[field] in loop(b["dtype"], field),
                lambda b: f"{family} {b['dtype']} kernels have no {noun} variant",
                hint=f"drop `{field}` for this dtype", blame=field)


def static_quant_iff_fp8(family: str, pipes: Callable[[str], dict | None], what: str) -> Rule:
    """``ck.<family>.static-quant-iff-fp8``: get_pipelines' squant = (dtype == "fp8")."""
    def message(b):
        if b["dtype"] == "fp8":
            return f"{family} {b['dtype']} kernels always use fp8 static quantization"
        return f"{family} {b['dtype']} kernels have no fp8 static quantization"
    return Rule(f"ck.{family}.static-quant-iff-fp8", ("dtype", "fp8_static_quant"),
                lambda b: b["fp8_static_quant"] == (pipes(b["dtype"]) or {}).get("fp8_static_quant"), message,
                hint=f"fp8 {what} kernels need `fp8_static_quant`; other dtypes must not set it",
                blame="fp8_static_quant")


def receipt_chain(branches: dict[int, Callable[[dict], bool]]) -> Callable[[dict], bool]:
    """A forward generator's receipt block as a predicate: -1 (profile ``all``) keeps everything, the
    fp32-only receipts 800 / 801 keep fp32 kernels only (these generators have none), a receipt of
    ``branches`` keeps what its condition accepts, and receipts the generator does not name keep everything."""
    def keeps(b: dict) -> bool:
        r = b["receipt"]
        if r == -1:
            return True
        if r in (800, 801):
            return b["dtype"] == "fp32"
        cond = branches.get(r)
        return cond is None or cond(b)
    return keeps


def half_row_unquantized(b: dict) -> bool:
    """fp16/bf16, row-major V, no fp8 static quantisation: the common part of most integrations' receipts."""
    return b["dtype"] in FP16_BF16 and b["vlayout"] == "r" and not b["fp8_static_quant"]


def receipt_rule(family: str, deps: tuple[str, ...], keeps: Callable[[dict], bool]) -> Rule:
    """``receipt.<family>``: the generator's receipt chain (a filter: it drops silently)."""
    return Rule(f"receipt.{family}", deps, keeps,
                lambda b: f"{profile_text(b)} leaves out this {family} kernel", filter=True)
