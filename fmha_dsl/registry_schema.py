"""The registry JSON document as Pydantic models: validation on load and the JSON Schema.

Imported only when a registry is read or its schema printed, so writing a registry builds no models.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from .keys import Algorithm, Arch, Signature


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
    build: Optional[dict[str, Any]] = None


class MetadataModel(_Strict):
    registry_name: str
    total_kernels: int
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
    compute_units: Optional[int] = None


class SeqtuneClassKeyModel(_Strict):
    family: str
    dtype: str
    mode: str
    vlayout: str
    hdim_q: int
    hdim_v: int
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


class SeqtunePointModel(_Strict):
    seqlen_q: int
    seqlen_k: int
    batch: int
    nhead_q: int
    nhead_k: int
    times_us: dict[str, float]
    failed: dict[str, str] = {}


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
    schema_version: Literal[1, 2]
    metadata: MetadataModel
    statistics: dict[str, dict[str, int]]
    kernels: list[KernelEntryModel]
    seqtune: Optional[SeqtuneModel] = None


def json_schema() -> dict:
    return RegistryModel.model_json_schema()
