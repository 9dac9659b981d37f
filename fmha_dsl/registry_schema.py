"""The registry JSON document as Pydantic models: validation on load and the JSON Schema.

Imported only when a registry is read or its schema printed, so writing a registry builds no models.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict

from .keys import Algorithm, Signature


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KernelEntryModel(_Strict):
    name: str
    identifier: str
    family: str
    dtype: str
    pipeline: str
    gfx_arch: str
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


class RegistryModel(_Strict):
    schema_version: int
    metadata: MetadataModel
    statistics: dict[str, dict[str, int]]
    kernels: list[KernelEntryModel]


def json_schema() -> dict:
    return RegistryModel.model_json_schema()
