"""The package layers run realtime -> engine -> kernels, with no import cycles and no
imports hidden inside functions (which is how a cycle gets dodged rather than fixed)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("realtime", "engine", "kernels", "clients", "latency_bench", "training")
# what each package may import of the project; anything else is an upward or sideways import
ALLOWED = {
    "kernels": set(),
    "engine": {"kernels"},
    "realtime": {"engine", "kernels"},
    "clients": set(),
    "latency_bench": {"realtime", "engine", "kernels", "clients"},
    "training": {"realtime", "engine", "kernels", "clients"},  # on top: nothing imports it
}
SERVED = ("realtime", "engine", "kernels")  # the product's packages: every import at module level


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def project_imports(path: Path, known: dict[str, Path], top_level_only: bool) -> list[tuple[str, int]]:
    """(imported project module, line) for each import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.append((name, node.lineno))
    return out


def test_each_package_imports_only_the_layers_below_it():
    known = modules()
    wrong = []
    for module, path in known.items():
        package = module.split(".")[0]
        for target, line in project_imports(path, known, top_level_only=False):
            other = target.split(".")[0]
            if other != package and other not in ALLOWED[package]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_the_served_packages_import_at_module_level_only():
    known = modules()
    hidden = []
    for module, path in known.items():
        if module.split(".")[0] not in SERVED:
            continue
        top = set(project_imports(path, known, top_level_only=True))
        for target, line in project_imports(path, known, top_level_only=False):
            if (target, line) not in top:
                hidden.append(f"{path.relative_to(ROOT)}:{line} imports {target} inside a function")
    assert not hidden, "\n".join(sorted(set(hidden)))


def test_no_import_cycles():
    known = modules()
    graph = {m: {t for t, _ in project_imports(p, known, top_level_only=False) if t != m} for m, p in known.items()}
    # a module importing its own package's __init__ (or the reverse) is Python's normal way in
    for m in graph:
        graph[m] = {t for t in graph[m] if not m.startswith(t + ".") and not t.startswith(m + ".")}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(" -> ".join(path[path.index(t):] + [t]))
            elif t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)
