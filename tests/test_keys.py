"""Kernel keys: frozen, canonical, JSON round-trip, identifier covers every field."""

import json

import pytest
from pydantic import ValidationError

from fmha_dsl import Algorithm, KernelKey, Problem, Signature
from fmha_dsl.keys import identifier_of, json_schema

KEY = KernelKey(signature=Signature(family="fwd", dtype="bf16", hdim_q=128, hdim_v=128, mask="top_left"),
                algorithm=Algorithm(pipeline="qr_async", tile=(128, 128, 32, 128, 32, 128)), arch="gfx942")


def test_frozen_and_hashable():
    with pytest.raises(ValidationError):
        KEY.arch = "gfx950"
    assert hash(KEY) == hash(KernelKey.model_validate_json(KEY.model_dump_json()))
    assert len({KEY, KernelKey.model_validate_json(KEY.model_dump_json())}) == 1


def test_json_round_trip():
    again = KernelKey.model_validate_json(KEY.model_dump_json())
    assert again == KEY
    assert again.canonical_json() == KEY.canonical_json()
    assert again.digest() == KEY.digest()


def test_extra_fields_and_bad_values_rejected():
    doc = json.loads(KEY.model_dump_json())
    doc["signature"]["colour"] = "red"
    with pytest.raises(ValidationError):
        KernelKey.model_validate(doc)
    doc = json.loads(KEY.model_dump_json())
    doc["signature"]["dtype"] = "fp17"
    with pytest.raises(ValidationError):
        KernelKey.model_validate(doc)
    with pytest.raises(ValidationError):
        Algorithm(tile=(1, 2, 3))
    with pytest.raises(ValidationError):
        Signature(hdim_q="128")  # strict: no silent coercion


def _variants():
    """One changed copy of KEY per field (every field of signature, algorithm and arch)."""
    sig, alg = KEY.signature.model_dump(), KEY.algorithm.model_dump()
    bumps = []
    for name, v in sig.items():
        new = dict(sig)
        new[name] = (not v) if isinstance(v, bool) else (v + 8 if isinstance(v, int) else
                                                          {"fwd": "bwd_dq_dk_dv", "bf16": "fp16", "batch": "group",
                                                           "r": "c", "top_left": "bottom_right", "no": "alibi",
                                                           "none": "inter", "vectorized": "linear",
                                                           "sglang": "vllm"}[v])
        if name == "qscale":
            new[name] = "pertensor"
        bumps.append((f"signature.{name}", KEY.model_copy(update={"signature": Signature(**new)})))
    for name, v in alg.items():
        new = dict(alg)
        if isinstance(v, bool):
            new[name] = not v
        elif name.startswith("pad_"):
            new[name] = 0
        elif isinstance(v, int):
            new[name] = v + 1
        elif isinstance(v, str):
            new[name] = "qr" if name == "pipeline" else v + "x"
        else:  # tuples: change the last element (the m2/n2/k2 dims for wave/warp)
            new[name] = tuple(v[:-1]) + (v[-1] + 1,)
        bumps.append((f"algorithm.{name}", KEY.model_copy(update={"algorithm": Algorithm(**new)})))
    bumps.append(("arch", KEY.model_copy(update={"arch": "gfx950"})))
    return bumps


@pytest.mark.parametrize("field,other", _variants(), ids=[f for f, _ in _variants()])
def test_identifier_covers_every_field(field, other):
    assert other != KEY
    assert other.identifier != KEY.identifier, field
    assert other.digest() != KEY.digest()


def test_identifier_is_plain_and_deterministic():
    ident = identifier_of(KEY.signature, KEY.algorithm, KEY.arch)
    assert ident == KEY.identifier
    assert ident.startswith("fmha_fwd_bf16_batch_vr_hq128_hv128_mtop_left")
    assert ident.endswith("_gfx942")


def test_schema_export():
    s = json_schema()
    assert s["type"] == "object"
    assert set(s["required"]) == {"signature", "algorithm", "arch"}
    json.dumps(s)


def test_problem_validation():
    p = Problem(batch=2, nhead_q=8, nhead_k=2, seqlen_q=100, seqlen_k=300, hdim_q=64, hdim_v=64)
    assert p.num_ops() == 2 * 2 * 8 * 100 * 300 * 128
    from fmha_dsl import UsageError

    with pytest.raises(UsageError, match="nhead_q \\(6\\) must be a multiple of nhead_k \\(4\\)") as info:
        Problem(nhead_q=6, nhead_k=4)
    assert info.value.rule == "usage.problem" and info.value.hint
    with pytest.raises(UsageError, match="Problem `batch`: Input should be greater than or equal to 1, got 0"):
        Problem(batch=0)
    with pytest.raises(UsageError, match="Problem has no field `nhaed_q`") as info:
        Problem(nhaed_q=2)
    assert "nhead_q" in info.value.hint


def test_plain_field_names_match_the_models():
    from fmha_dsl.fields import ALG_KEYS, SIG_KEYS

    assert SIG_KEYS == tuple(Signature.model_fields)
    assert ALG_KEYS == tuple(Algorithm.model_fields)
