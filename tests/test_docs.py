"""The README's example kernel set is real: it parses, validates and expands."""

import os
import re

import fmha_dsl

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def test_readme_kernel_set_expands():
    with open(README) as f:
        text = f.read()
    blocks = re.findall(r"```\n(kernel_set \w+ \{.*?\n\})\n```", text, re.S)
    assert blocks, "README lost its example kernel set"
    for block in blocks:
        rep = fmha_dsl.loads(block).expand_report()
        assert rep.kernels and not rep.notes
