"""No import cycles among fmha-dsl's modules.

The graph is read from the source with ``ast``: every ``import`` statement counts, at module level or inside a
function (a lazy import only postpones a cycle) or under ``if TYPE_CHECKING:``; importing ``a.b.c`` also imports
the packages ``a.b`` and ``a`` (their ``__init__`` runs first), except a module's own parents.  Only the package
facades' string-named lazy re-exports (``importlib.import_module`` in ``fmha_dsl/__init__.py`` and
``runtime/__init__.py``) are not seen; they point down the graph by construction.  docs/architecture.md shows the
layering.
"""

import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# import name -> folder in the source tree (pyproject's package-dir)
ROOTS = {"fmha_dsl": "fmha_dsl", "fmha_dsl.runtime": "runtime", "fmha_dsl.grammar": "grammar",
         "fmha_dsl.kernelsets": "kernelsets"}


def _modules() -> dict[str, str]:
    mods = {}
    for pkg, folder in ROOTS.items():
        top = os.path.join(REPO, folder)
        for dirpath, _, files in os.walk(top):
            rel = os.path.relpath(dirpath, top)
            base = pkg if rel == "." else pkg + "." + rel.replace(os.sep, ".")
            for f in files:
                if f.endswith(".py"):
                    mods[base if f == "__init__.py" else f"{base}.{f[:-3]}"] = os.path.join(dirpath, f)
    return mods


def _targets(mod: str, is_pkg: bool, node, mods) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        parts = mod.split(".") if is_pkg else mod.split(".")[:-1]
        parts = parts[:len(parts) - node.level + 1]
        base = ".".join(parts + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: first line}, fmha-dsl modules only."""
    mods = _modules()
    graph: dict[str, dict[str, int]] = {m: {} for m in mods}
    for mod, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(mod, path.endswith("__init__.py"), node, mods):
                while target:  # the module and every package above it
                    if target in mods and target != mod and not mod.startswith(target + "."):
                        graph[mod].setdefault(target, node.lineno)
                    target = target.rpartition(".")[0]
    return graph


def find_cycle(graph) -> list[str] | None:
    """One cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}   # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycles():
    graph = import_graph()
    assert "fmha_dsl.runtime.dispatch" in graph and "fmha_dsl.keys" in graph  # the walk found the tree
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(
        f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_the_detector_sees_lazy_imports():
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}) == ["a", "b", "c", "a"]
    graph = import_graph()
    assert "fmha_dsl.keys" in graph["fmha_dsl.keyfields"]       # imported inside KeyFields.key
    assert "fmha_dsl.build_triton" in graph["fmha_dsl.build"]   # imported inside build()


def test_only_the_cli_modules_print_or_exit():
    """Library code never prints or exits: print(), sys.exit() and exit() appear only in fmha_dsl/cli*.py."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    offenders = []
    for folder in ("fmha_dsl", "runtime", "grammar", "kernelsets"):
        for path in sorted((root / folder).rglob("*.py")):
            if path.parent.name == "fmha_dsl" and path.name.startswith("cli"):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    f = node.func
                    name = f.id if isinstance(f, ast.Name) else f"{getattr(f.value, 'id', '')}.{f.attr}" \
                        if isinstance(f, ast.Attribute) else ""
                    if name in ("print", "exit", "quit", "sys.exit", "os._exit"):
                        offenders.append(f"{path.relative_to(root)}:{node.lineno}: {name}()")
    assert not offenders, offenders
