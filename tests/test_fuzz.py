"""Fuzzing: random text and mutations of valid files only ever raise located DSL errors."""

import glob
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fmha_dsl
from fmha_dsl import FmhaError
from fmha_dsl.fmt import format_source

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SEEDS = [open(p).read() for p in sorted(glob.glob(os.path.join(REPO, "grammar", "examples", "*.fmha")))]
SEEDS.append("""kernel_set s { arch(gfx942) kernel k { signature { family(fwd) dtype(fp16 | bf16) hdim(128) mask(*) }
  algorithm { pipeline(*) tile(*) padding(*) } where tile_m0 >= 64 } }""")
TOKENS = ["kernel_set", "kernel", "signature", "algorithm", "where", "include", "add", "{", "}", "(", ")", "[", "]",
          ",", "|", "*", ".", ";", "=", "and", "or", "not", "in", "==", "<", "-", "fp16", "fwd", "hdim", "tile",
          "128", "0", "-1", '"x"', "#c\n", "/*", "*/", "gfx942", "arch", "true", "qr", "FmhaSignature()"]

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(text: str) -> None:
    try:
        ks = fmha_dsl.loads(text, None)
        # keep expansion small: only a few arches/families are reachable from fuzzed text
        ks.expand_report(arch="gfx942")
    except FmhaError as exc:
        for d in exc.diagnostics:
            assert d.rule and d.message
            if d.span is not None:
                assert d.span.line >= 1 and d.span.column >= 1
        exc.render()  # rendering never fails


@FAST
@given(st.text(max_size=200))
def test_random_text(text):
    run(text)


@FAST
@given(st.lists(st.sampled_from(TOKENS), max_size=40).map(" ".join))
def test_random_tokens(text):
    run(text)


@st.composite
def mutated(draw):
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, max(0, len(text) - 1)))
        op = draw(st.sampled_from(["delete", "insert", "replace", "dup"]))
        if op == "delete":
            j = i + draw(st.integers(1, 10))
            text = text[:i] + text[j:]
        elif op == "insert":
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[i:]
        elif op == "replace":
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[i + 1:]
        else:
            j = i + draw(st.integers(1, 30))
            text = text[:j] + text[i:j] + text[j:]
    return text


@FAST
@given(mutated())
def test_mutations_of_valid_files(text):
    run(text)


@FAST
@given(mutated())
def test_formatter_is_idempotent_when_it_accepts(text):
    try:
        once = format_source(text)
    except FmhaError:
        return
    assert format_source(once) == once
