"""[keys] Pydantic v2 kernel keys: Signature, Algorithm, KernelKey, Problem.

Frozen, hashable, canonical (aliases resolved before construction), ``extra="forbid"``, JSON
round-trip and JSON Schema export.  ``KernelKey.identifier`` covers every field, the arch and the
third-gemm (m2/n2/k2) dims included, so keys built for different archs never collide (CK's
``encode_identifier`` leaves out arch and m2/n2/k2).  Persistent identity is sha256 of canonical
JSON (``digest``), never Python's ``hash()``.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from . import vocab as V
from .fields import identifier_from

Family = Literal[V.FAMILIES]
DType = Literal[V.DTYPES]
Mask = Literal["no", "top_left", "bottom_right", "generic"]
Bias = Literal["no", "bias", "alibi"]
QScale = Literal[V.QSCALES]
Rope = Literal["none", "inter", "half"]
Arch = Literal[V.ARCHS]
Pad = Literal[0, 1, 8]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class Signature(_Frozen):
    """What a kernel computes (the problem class it serves)."""

    family: Family = "fwd"
    dtype: DType = "fp16"
    mode: Literal["batch", "group"] = "batch"
    vlayout: Literal["r", "c"] = "r"
    hdim_q: int = Field(128, ge=1, le=1024)
    hdim_v: int = Field(128, ge=1, le=1024)
    mask: Mask = "no"
    bias: Bias = "no"
    lse: bool = False
    dropout: bool = False
    qscale: QScale = "no"
    rope: Rope = "none"
    logits: bool = False
    paged_kv: bool = False
    fp8_static_quant: bool = False
    skip: bool = False
    sink: bool = False
    dbias: bool = False
    store_randval: bool = False
    deterministic: bool = False
    kv_layout: Literal["vectorized", "linear"] = "vectorized"
    kv_lookup: Literal["vllm", "sglang"] = "sglang"
    page_size: int = Field(1, ge=0)


class Algorithm(_Frozen):
    """How a kernel computes it (tiles, warps, pipeline, padding...)."""

    pipeline: str = "qr"
    tile: tuple[int, ...] = V.TILE_DEFAULT
    wave: tuple[int, int, int, int, int, int, int, int, int] = V.WAVE_DEFAULT
    warp: tuple[int, int, int, int, int, int, int, int, int] = V.WARP_DEFAULT
    pad_s: Pad = 1
    pad_sk: Pad = 1
    pad_d: Pad = 1
    pad_dv: Pad = 1
    trload: bool = False
    kv64: bool = False
    hdim_q_alignment: int = Field(0, ge=0, le=1024)
    hdim_v_alignment: int = Field(0, ge=0, le=1024)
    block_per_cu: int = Field(-1, ge=-1, le=1024)
    num_wave_groups: int = Field(1, ge=1)
    max_splits_log2: int = Field(0, ge=0)
    max_seq_len_q: int = Field(0, ge=0)
    selection_rank: int = Field(0, ge=-(1 << 31), lt=1 << 31)
    constraint: str = ""

    @field_validator("tile")
    @classmethod
    def _tile_len(cls, v):
        if len(v) not in (6, 9):
            raise ValueError(f"tile must have 6 values (9 for bwd_dq_dk_dv), got {len(v)}")
        return v

    @field_validator("tile", "wave", "warp")
    @classmethod
    def _in_range(cls, v):
        if any(not 0 <= x <= 4096 for x in v):   # (0: a dimension CK's kernel does not tile, e.g. append-KV's)
            raise ValueError(f"every value must lie in [0, 4096], got {list(v)}")
        return v

    @field_validator("pipeline")
    @classmethod
    def _pipeline_known(cls, v):
        if v not in V.PIPELINES:
            raise ValueError(f"unknown pipeline {v!r}")
        return v


class KernelKey(_Frozen):
    signature: Signature
    algorithm: Algorithm
    arch: Arch

    def canonical_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    @functools.cached_property
    def identifier(self) -> str:
        return identifier_of(self.signature, self.algorithm, self.arch)


def identifier_of(s: Signature, a: Algorithm, arch: str) -> str:
    return identifier_from(s.__dict__, a.__dict__, arch)


class Problem(_Frozen):
    """A concrete attention call, as the dispatcher sees it.  A bad field is a :class:`~fmha_dsl.UsageError`
    (``usage.problem``) naming it."""

    family: Family = "fwd"
    dtype: DType = "fp16"
    arch: Optional[Arch] = None
    batch: int = Field(1, ge=1)
    nhead_q: int = Field(1, ge=1)
    nhead_k: int = Field(1, ge=1)
    seqlen_q: int = Field(1, ge=0)
    seqlen_k: int = Field(1, ge=0)
    max_seqlen_q: int = Field(0, ge=0)
    max_seqlen_k: int = Field(0, ge=0)
    hdim_q: int = Field(128, ge=1)
    hdim_v: int = Field(128, ge=1)
    mode: Literal["batch", "group"] = "batch"
    vlayout: Literal["r", "c"] = "r"
    mask: Mask = "no"
    window_left: int = -1
    window_right: int = -1
    bias: Bias = "no"
    lse: bool = False
    dropout: bool = False
    qscale: QScale = "no"
    rope: Rope = "none"
    logits: bool = False
    paged_kv: bool = False
    fp8_static_quant: bool = False
    skip: bool = False
    sink: bool = False
    dbias: bool = False
    store_randval: bool = False
    deterministic: bool = False
    kv_layout: Literal["vectorized", "linear"] = "vectorized"
    kv_lookup: Literal["vllm", "sglang"] = "sglang"
    page_size: int = Field(1, ge=1)
    num_splits: int = Field(1, ge=1)

    def __init__(self, **fields):
        try:
            super().__init__(**fields)
        except ValidationError as exc:
            raise _problem_error(exc, fields) from None

    @model_validator(mode="after")
    def _check(self):
        if self.nhead_q % self.nhead_k:
            raise ValueError(f"nhead_q ({self.nhead_q}) must be a multiple of nhead_k ({self.nhead_k}) for GQA/MQA")
        return self

    @property
    def effective_max_seqlen_q(self) -> int:
        return self.max_seqlen_q or self.seqlen_q

    @property
    def effective_max_seqlen_k(self) -> int:
        return self.max_seqlen_k or self.seqlen_k

    def num_ops(self) -> int:
        return 2 * self.batch * self.nhead_q * self.effective_max_seqlen_q * self.effective_max_seqlen_k * (
            self.hdim_q + self.hdim_v)


def _problem_error(exc, fields: dict):
    """The first of a ValidationError's complaints about a :class:`Problem`, as a located UsageError."""
    from .errors import UsageError, did_you_mean, error
    from .numeric import shown

    e = exc.errors()[0]
    name = ".".join(str(x) for x in e["loc"])
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        return error("usage.problem", f"Problem has no field `{name}`", None,
                     did_you_mean(name, list(Problem.model_fields)) or "fields: " + ", ".join(Problem.model_fields),
                     cls=UsageError)
    if not name:   # the model's own check (GQA)
        return error("usage.problem", f"Problem: {msg}", None, "nhead_q = group x nhead_k", cls=UsageError)
    return error("usage.problem", f"Problem `{name}`: {msg}, got {shown(fields.get(name))}", None,
                 "a Problem describes one call: its lengths, heads, head dims and flags", cls=UsageError)


def json_schema() -> dict:
    """JSON Schema of a kernel key (what ``fmha-dsl schema key`` prints)."""
    return KernelKey.model_json_schema(mode="serialization")


__all__ = ["Signature", "Algorithm", "KernelKey", "Problem", "identifier_of", "identifier_from", "json_schema"]
