"""The package's Python sources, for the tests that read the tree as text (imported by test modules; not a test
module)."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_DIRS = ("fmha_dsl", "runtime", "grammar", "kernelsets")  # the folders the wheel installs


def python_sources(skip: tuple[str, ...] = ()):
    """``(path, text)`` of every ``.py`` file the wheel installs, except the repository-relative paths in ``skip``."""
    skipped = {os.path.join(REPO, s) for s in skip}
    for top in SOURCE_DIRS:
        for dirpath, _, files in os.walk(os.path.join(REPO, top)):
            for f in sorted(files):
                path = os.path.join(dirpath, f)
                if f.endswith(".py") and path not in skipped:
                    with open(path, encoding="utf-8") as fh:
                        yield path, fh.read()
