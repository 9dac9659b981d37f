"""Every FMHA_DSL_* environment variable is declared once (fmha_dsl/knobs.py), read only there, and documented."""

import ast
import os
import re

import pytest

from sources import REPO, python_sources

from fmha_dsl import knobs
from fmha_dsl.errors import UsageError

NAME = re.compile(r"FMHA_DSL_[A-Z0-9_]+")


def test_no_knob_is_read_outside_knobs_py():
    """No os.environ/getenv call names an FMHA_DSL_ variable, and no bare "FMHA_DSL_X" string (a name handed to a
    reader elsewhere) exists outside knobs.py; prose in docstrings and messages may mention them."""
    bad = []
    for path, text in python_sources(skip=("fmha_dsl/knobs.py",)):
        for lineno, line in enumerate(text.splitlines(), 1):
            if NAME.search(line) and re.search(r"environ|getenv|putenv", line):
                bad.append(f"{path}:{lineno}: {line.strip()}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
                bad.append(f"{path}:{node.lineno}: the knob name {node.value!r} as a value")
    assert not bad, "read FMHA_DSL_* through fmha_dsl.knobs:\n" + "\n".join(bad)


def test_every_knob_is_documented_and_every_mentioned_knob_exists():
    declared = {k.name for k in knobs.KNOBS}
    assert len(declared) == len(knobs.KNOBS)
    doc = open(os.path.join(REPO, "docs", "knobs.md"), encoding="utf-8").read()
    assert knobs.markdown_table() in doc, "docs/knobs.md's table differs from knobs.markdown_table()"
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    assert "docs/knobs.md" in readme
    mentioned = set()
    for _, text in python_sources():
        mentioned |= set(NAME.findall(text))
    for path in [*(os.path.join(REPO, "docs", f) for f in os.listdir(os.path.join(REPO, "docs"))),
                 os.path.join(REPO, "README.md")]:
        if path.endswith(".md"):
            mentioned |= set(NAME.findall(open(path, encoding="utf-8").read()))
    assert mentioned <= declared, f"undeclared knobs mentioned: {sorted(mentioned - declared)}"


def test_knobs_are_read_at_call_time(monkeypatch):
    monkeypatch.delenv("FMHA_DSL_NO_BUILD", raising=False)
    assert knobs.no_build() is False
    for text, want in (("1", True), ("yes", True), ("TRUE", True), ("0", False), ("off", False), ("", False)):
        monkeypatch.setenv("FMHA_DSL_NO_BUILD", text)
        assert knobs.no_build() is want
    monkeypatch.setenv("FMHA_DSL_NO_BUILD", "maybe")
    with pytest.raises(UsageError, match="FMHA_DSL_NO_BUILD=maybe"):
        knobs.no_build()
    monkeypatch.setenv("FMHA_DSL_LAUNCHER", "")
    assert knobs.launcher() == "auto"
    monkeypatch.setenv("FMHA_DSL_CACHE_DIR", "/x")
    assert knobs.cache_dir() == "/x"


@pytest.mark.parametrize("knob", [k for k in knobs.KNOBS if k.kind == "bool"], ids=lambda k: k.name)
def test_boolean_knobs_take_the_usual_words_and_name_the_variable_when_malformed(monkeypatch, knob):
    for text, want in (("1", True), ("Yes", True), ("off", False), ("0", False), ("", knob.default)):
        monkeypatch.setenv(knob.name, text)
        assert knob.get() is want
    monkeypatch.setenv(knob.name, "maybe")
    with pytest.raises(UsageError, match=f"{knob.name}=maybe: expected a boolean") as ei:
        knob.get()
    assert "true" in ei.value.hint and "off" in ei.value.hint


def test_whole_number_knobs_name_the_variable_when_malformed(monkeypatch):
    monkeypatch.delenv("FMHA_DSL_TUNE_CANDIDATES", raising=False)
    assert knobs.tune_candidates() == 24
    monkeypatch.setenv("FMHA_DSL_TUNE_CANDIDATES", " 8 ")
    assert knobs.tune_candidates() == 8
    for bad in ("eight", "0", "-3", "2.5"):
        monkeypatch.setenv("FMHA_DSL_TUNE_CANDIDATES", bad)
        with pytest.raises(UsageError, match=f"FMHA_DSL_TUNE_CANDIDATES={re.escape(bad)}") as ei:
            knobs.tune_candidates()
        assert "unset it" in ei.value.hint
    monkeypatch.delenv("FMHA_DSL_JOBS", raising=False)
    assert knobs.jobs() == max(1, os.cpu_count() or 1)
