"""The house rules of `src/rlft`, read from the source: imports only go down the layers, no files import each other in a
circle, an import inside a function says why, no file is over 450 lines, and no text cites files outside the repo.
docs/architecture.md draws the same layers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "rlft"
# each layer may import the layers before it, never one after it
LAYERS = (("errors", "usercode", "heap", "phase_ranges"), ("config",), ("losses",), ("data",), ("models",), ("tasks",), ("rollout",),
          ("train",), ("quickstart",), ("cli",))
MAX_LINES = 450


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> int:
    if module == "rlft":
        return 0  # the package's own __init__ imports nothing of ours
    top = module.split(".")[1]
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    raise AssertionError(f"{module}: its package {top!r} is in no layer of {LAYERS}: add it to LAYERS and to docs/architecture.md")


def _imported(module: str, node: ast.AST) -> list[str]:
    """The rlft modules an import statement names (a name imported from a package counts as its submodule if it is one)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
            base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    else:
        return []
    found = []
    for name in names:
        while name not in MODULES and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in MODULES and name != module:
            found.append(name)
    return found


def _graph() -> dict[str, set[str]]:
    return {module: {target for node in ast.walk(ast.parse(path.read_text())) for target in _imported(module, node)}
            for module, path in MODULES.items()}


def test_imports_only_go_down_the_layers():
    back = [f"{module} imports {target}" for module, targets in _graph().items() for target in sorted(targets)
            if _layer(target) > _layer(module)]
    assert not back, "imports that point up a layer:\n" + "\n".join(back)


def test_no_files_import_each_other_in_a_circle():
    graph, index, low, stack, on_stack, circles = _graph(), {}, {}, [], set(), []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                circles.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    assert not circles, f"files that import each other: {circles}"


def _import_runs(function: ast.AST):
    """The runs of consecutive import statements inside a function, each as (first, last) statements."""
    for node in ast.walk(function):
        for field in ("body", "orelse", "finalbody", "handlers"):
            statements, run = getattr(node, field, []), []
            for statement in [*(statements if isinstance(statements, list) else []), None]:
                if isinstance(statement, (ast.Import, ast.ImportFrom)):
                    run.append(statement)
                elif run:
                    yield run[0], run[-1]
                    run = []


def test_an_import_inside_a_function_says_why():
    """Imports go at the top; one inside a function (to load an optional or heavy package only when it is used) has a
    comment on its lines or just above them (above the `with` that holds them, if any)."""
    silent = set()
    for path in MODULES.values():
        lines = path.read_text().splitlines()
        functions = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for first, last in {run for function in functions for run in _import_runs(function)}:
            if any("#" in line for line in lines[first.lineno - 1:last.end_lineno]):
                continue
            above = first.lineno - 2
            while above >= 0 and (not lines[above].strip() or lines[above].strip().startswith("with ")):
                above -= 1
            if above < 0 or not lines[above].strip().startswith("#"):
                silent.add(f"{path.relative_to(PACKAGE.parent)}:{first.lineno}: {lines[first.lineno - 1].strip()}")
    assert not silent, "imports inside a function with no comment saying why:\n" + "\n".join(sorted(silent))


def test_no_file_is_over_450_lines():
    long = {str(path.relative_to(PACKAGE.parent)): n for path in MODULES.values()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


def test_texts_cite_nothing_outside_the_repo():
    """Comments, docstrings and messages state facts with their public source, never a file of the project's notes."""
    cited = [f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}" for path in MODULES.values()
             for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"\bspec/|§", line)]
    assert not cited, "\n".join(cited)
