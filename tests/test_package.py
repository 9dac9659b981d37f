"""Packaging: no work at import, data shipped in the installed package, library never prints."""

import os
import subprocess
import sys

import pytest


def test_import_does_no_work():
    code = ("import sys, fmha_dsl; heavy = [m for m in ('lark', 'pydantic', 'numpy', 'triton', 'torch') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_submodule_named_in_the_docs_is_an_attribute_after_a_plain_import():
    """docs/triton.md and paged_attention's errors say ``fmha_dsl.paged.workspace_numel``: after ``import fmha_dsl``
    alone that resolves (imported then), and a name that is no submodule is still an AttributeError."""
    code = ("import sys, fmha_dsl; assert 'fmha_dsl.paged' not in sys.modules; f = fmha_dsl.paged.workspace_numel\n"
            "try:\n    fmha_dsl.no_such_module\nexcept AttributeError as e:\n    print('refused', e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "refused module 'fmha_dsl' has no attribute 'no_such_module'" in out.stdout


def test_shipped_data_is_found_from_any_directory(tmp_path):
    code = ("import fmha_dsl; from fmha_dsl.parse import grammar_text; "
            "assert 'kernel_set' in grammar_text(); "
            "from fmha_dsl.runtime import native; assert b'PyInit__fmha_native' in native._source(); "
            "from fmha_dsl.runtime import cext, torch_fast; "
            "assert b'PyInit__fmha_torch_fast' in cext.read_sources(torch_fast.SOURCES); "
            "ks = fmha_dsl.load(fmha_dsl.shipped('ck_receipt0')); print(len(ks.declarations))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "9"


def test_library_does_not_print(capsys):
    import fmha_dsl

    ks = fmha_dsl.load(fmha_dsl.shipped("ck_receipt0"))
    ks.expand_report(arch="gfx1100")  # warnings are data, not output
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_no_eval_in_package():
    import fmha_dsl

    root = os.path.dirname(fmha_dsl.__file__)
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                text = open(os.path.join(dirpath, f)).read()
                assert "eval(" not in text.replace("model_validate", "") and "exec(" not in text, f


def test_parser_table_cache_is_content_addressed_and_self_healing(tmp_path, monkeypatch):
    """The LALR tables are cached as JSON keyed by grammar text + Lark version; a corrupt file is rebuilt."""
    from fmha_dsl import parse as P

    monkeypatch.setenv("FMHA_DSL_CACHE_DIR", str(tmp_path))
    text = "kernel_set a { kernel { signature { dtype(fp16) } } }  # c\n"
    P._parser.cache_clear()
    fresh = P.parse_text(text)                   # builds and writes the cache
    files = list((tmp_path / "parser").iterdir())
    assert len(files) == 1 and files[0].suffix == ".json"
    P._parser.cache_clear()
    assert P.parse_text(text) == fresh           # loaded from the cache: same tree, same comments
    files[0].write_text("{ not json")
    P._parser.cache_clear()
    assert P.parse_text(text) == fresh           # corrupt cache: rebuilt, not trusted
    P._parser.cache_clear()


def test_every_subpackage_is_installed():
    """Each folder of the source package with an __init__.py must be in the wheel (pyproject's list)."""
    import importlib

    import fmha_dsl

    root = os.path.dirname(fmha_dsl.__file__)
    for name in sorted(os.listdir(root)):
        if os.path.isfile(os.path.join(root, name, "__init__.py")):
            importlib.import_module(f"fmha_dsl.{name}")
    for sub in ("grammar", "kernelsets", "runtime", "kernels", "rules", "data"):
        importlib.import_module(f"fmha_dsl.{sub}")


def test_source_checkout_maps_the_top_level_folders_like_the_wheel(tmp_path):
    """From a checkout (no install, or ``pip install -e .``), ``fmha_dsl.runtime``/``grammar``/``kernelsets`` are
    the repository's top-level folders, the same modules the wheel installs under the package."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import fmha_dsl, fmha_dsl.runtime, fmha_dsl.grammar, fmha_dsl.kernelsets, os; "
            "print(os.path.dirname(fmha_dsl.__file__)); print(os.path.dirname(fmha_dsl.runtime.__file__)); "
            "print(fmha_dsl.shipped('ck_receipt0'))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = repo  # the checkout first, whatever else is installed
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(tmp_path), env=env)
    assert out.returncode == 0, out.stderr
    pkg, runtime, shipped = out.stdout.split()
    assert pkg == os.path.join(repo, "fmha_dsl")
    assert runtime == os.path.join(repo, "runtime")
    assert shipped == os.path.join(repo, "kernelsets", "ck_receipt0.fmha")


def test_every_fmha_dsl_name_the_gpu_tests_import_exists():
    """The GPU test files skip on a machine without a GPU before their in-function imports run, so CPU CI would not
    see a name they import go missing (session 35 moved ``precompile`` out of ``first_use`` and left
    ``tests/test_gpu_bwd.py`` importing it from there: 41 errors on the GPU).  Every ``from fmha_dsl... import``
    in them, at any depth, must resolve here.  (Attribute uses such as ``fmha_dsl.paged.workspace_numel`` and plain
    ``import fmha_dsl.x`` statements are not checked.)"""
    import ast
    import glob
    import importlib

    here = os.path.dirname(__file__)
    missing, seen = [], 0
    for path in sorted(glob.glob(os.path.join(here, "test_gpu*.py"))):
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("fmha_dsl"):
                try:
                    mod = importlib.import_module(node.module)
                except ImportError as exc:
                    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "torch":
                        continue  # a module that needs the optional torch: not this test's business
                    missing.append(f"{os.path.basename(path)}:{node.lineno}: {node.module} ({exc})")
                    continue
                for alias in node.names:
                    seen += 1
                    if not hasattr(mod, alias.name):
                        try:  # a submodule imported by name
                            importlib.import_module(f"{node.module}.{alias.name}")
                        except ImportError:
                            missing.append(f"{os.path.basename(path)}:{node.lineno}: {node.module}.{alias.name}")
    assert seen > 20, seen
    assert not missing, missing


def test_load_takes_a_shipped_set_by_name_as_the_command_line_does(tmp_path, monkeypatch):
    import fmha_dsl

    monkeypatch.chdir(tmp_path)   # (no file of that name here)
    assert fmha_dsl.load("ck_receipt0").path == fmha_dsl.shipped("ck_receipt0")
    with pytest.raises(fmha_dsl.ParseError) as info:
        fmha_dsl.load("ck_reciept0")
    assert info.value.rule == "input.file-not-found" and "ck_receipt0" in info.value.hint
    for missing in ("missing.fmha", "x/missing.fmha"):   # a file name is a path: never a shipped set
        with pytest.raises(fmha_dsl.ParseError, match="no such file: `" + missing) as info:
            fmha_dsl.load(missing)
        assert info.value.hint.startswith("check the path")
    with pytest.raises(fmha_dsl.ParseError, match="no such file: `serving.fmha`"):
        fmha_dsl.load("serving.fmha")   # (the package ships one: a file name still means a file here)
    (tmp_path / "ck_receipt0").write_text("kernel_set mine { kernel { signature { family(fwd) } } }\n")  # here first
    assert fmha_dsl.load("ck_receipt0").sets == ("mine",)


def test_hasattr_of_a_dotted_or_private_name_is_false():
    import fmha_dsl

    assert not hasattr(fmha_dsl, "x.y") and not hasattr(fmha_dsl, "_nothing") and not hasattr(fmha_dsl, "nope")
