"""The registry JSON document as Pydantic models: validation on load and the JSON Schema.

Imported only when a registry is read or its schema printed, so writing a registry builds no models.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Optional

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, StrictStr,
                      model_validator)

from . import vocab as V
from .keys import Algorithm, Arch, Signature
from .numeric import COUNT_MAX, TIME_RANGE_US, is_time


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _time(v):
    if not is_time(v):
        lo, hi = TIME_RANGE_US
        raise ValueError(f"a kernel time must be a number of microseconds in [{lo}, {hi:g}], got {v!r}")
    return float(v)


def _relative_path(v: str) -> str:
    parts = v.replace("\\", "/").split("/")
    if not v or "\0" in v or v.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", v) or ".." in parts:
        raise ValueError(f"a binary's path must stay inside the build directory (relative, no `..`), got {v!r}")
    return v


Time = Annotated[float, BeforeValidator(_time)]   # (before float's coercion: `true` is no time)
Count = Annotated[StrictInt, Field(ge=1)]
Size = Annotated[StrictInt, Field(ge=0)]
Length = Annotated[StrictInt, Field(ge=1, le=COUNT_MAX)]   # (the report's bounds: one set for both readers)


class ResourcesModel(BaseModel):
    """What ptxas / the AMD assembler reported for a binary (the cost model reads ``regs`` and ``spills``)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    regs: Optional[Size] = None
    spills: Optional[Size] = None


class BuildModel(BaseModel):
    """An entry's ``build`` object (a Triton build's; the fields a launch reads are typed, the rest kept as is), and
    its companion kernels' (``combine``, ``dot_do_o``, ``convert_dq``) of the same form.  A binary lies inside the
    build directory and comes with its sha256."""

    model_config = ConfigDict(extra="allow", frozen=True)
    binary: Optional[Annotated[StrictStr, AfterValidator(_relative_path)]] = None
    sha256: Optional[Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]] = None
    entry: Optional[Annotated[StrictStr, Field(min_length=1)]] = None
    params: Optional[list[StrictStr]] = None
    num_warps: Optional[Annotated[StrictInt, Field(ge=1, le=32)]] = None
    warp_size: Optional[Literal[32, 64]] = None
    shared: Optional[Size] = None
    global_scratch: Optional[Size] = None
    profile_scratch: Optional[Size] = None
    block_m: Optional[Count] = None
    block_n: Optional[Count] = None
    block_dv: Optional[Count] = None
    resources: Optional[ResourcesModel] = None
    combine: Optional["BuildModel"] = None
    dot_do_o: Optional["BuildModel"] = None
    convert_dq: Optional["BuildModel"] = None

    @model_validator(mode="after")
    def _hashed(self):
        if self.binary is not None and self.sha256 is None:
            raise ValueError("a binary needs its sha256 (the launch checks the file against it)")
        if self.binary is not None and self.entry is None:
            raise ValueError("a binary needs its `entry` (the kernel function a launch looks up)")
        return self


class KernelEntryModel(_Strict):
    name: str
    identifier: str
    family: str
    dtype: str
    pipeline: str
    gfx_arch: Arch
    source: str
    signature: Signature
    algorithm: Algorithm
    build: Optional[BuildModel] = None


class MetadataModel(_Strict):
    registry_name: str
    total_kernels: Size
    generator: str
    archs: list[str]
    profiles: list[str] = []
    sources: list[str] = []


class SeqtuneDeviceModel(_Strict):
    name: Optional[str] = None
    arch: Optional[str] = None
    driver: Optional[str] = None
    triton: Optional[str] = None
    torch: Optional[str] = None
    compute_units: Optional[Count] = None


class SeqtuneClassKeyModel(_Strict):
    family: str
    dtype: str
    mode: str
    vlayout: str
    hdim_q: Annotated[StrictInt, Field(ge=1, le=1024)]
    hdim_v: Annotated[StrictInt, Field(ge=1, le=1024)]
    mask: Literal["no", "causal"]
    bias: str
    lse: bool
    dropout: bool
    logits: bool
    sink: bool
    # serving classes (a paged KV cache): what the kernels compile in
    kv_layout: Optional[Literal["linear", "vectorized"]] = None
    kv_lookup: Optional[Literal["vllm", "sglang"]] = None
    page_size: Optional[int] = Field(None, ge=1)
    # FP8 classes: their descales' granularity (other kernels)
    qscale: Optional[Literal["pertensor", "kv_blockscale", "per_token_head"]] = None

    @model_validator(mode="after")
    def _known(self):   # (checked here, not typed: the published JSON schema keeps its strings)
        for field, allowed in (("family", V.FAMILIES), ("dtype", V.DTYPES), ("mode", V.MODES),
                               ("vlayout", V.VLAYOUTS), ("bias", V.BIASES)):
            if getattr(self, field) not in allowed:
                raise ValueError(f"{field} {getattr(self, field)!r} is none of {', '.join(allowed)}")
        return self


class SeqtunePointModel(_Strict):
    seqlen_q: Length
    seqlen_k: Length
    batch: Length
    nhead_q: Length
    nhead_k: Length
    times_us: dict[str, Time]
    failed: dict[str, str] = {}

    @model_validator(mode="after")
    def _groups(self):
        if self.nhead_q % self.nhead_k:
            raise ValueError(f"nhead_q ({self.nhead_q}) must be a multiple of nhead_k ({self.nhead_k})")
        return self


class SeqtuneClassModel(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    class_: SeqtuneClassKeyModel = Field(alias="class")
    points: list[SeqtunePointModel]


class SeqtuneModel(_Strict):
    """Measured kernel times per signature class and (seqlen_q, seqlen_k, batch, heads) point (schema_version 2)."""

    device: SeqtuneDeviceModel
    shapes: str = "default"
    classes: list[SeqtuneClassModel]


class RegistryModel(_Strict):
    schema_version: Literal[1, 2]   # (an int: registry.readable_version refuses true and 2.0 first)
    metadata: MetadataModel
    statistics: dict[str, dict[str, int]]
    kernels: list[KernelEntryModel]
    seqtune: Optional[SeqtuneModel] = None


def json_schema() -> dict:
    return RegistryModel.model_json_schema()
