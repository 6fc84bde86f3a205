"""kernels/ stands alone: every module imports on its own in a fresh interpreter without
pulling in the engine or the service, and the modules' imports of each other form no cycle
(a cycle is what function-level imports were hiding)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parent.parent / "kernels"
MODULES = sorted(p.stem for p in KERNELS.glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", MODULES)
def test_each_module_imports_alone_without_engine_or_realtime(name):
    code = ("import importlib, sys; importlib.import_module('kernels.' + sys.argv[1]); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('engine', 'realtime')))")
    env = {**os.environ, "PYTHONPATH": str(KERNELS.parent), "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", code, name], capture_output=True, text=True, timeout=300,
                            env=env, cwd=KERNELS.parent)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def kernel_imports(path: Path) -> tuple[set[str], list[str]]:
    """(the kernels modules `path` imports, where it imports one other than at module level)."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found, nested = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = ([node.module.split(".")[1]] if node.module.startswith("kernels.")
                     else [a.name for a in node.names] if node.module == "kernels" else [])
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[1] for a in node.names if a.name.startswith("kernels.")]
        else:
            continue
        found |= set(names)
        if names and id(node) not in top:
            nested.append(f"{path.name}:{node.lineno}")
    return found, nested


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the import graph as [a, b, ..., a], or None (depth-first search)."""
    done, active = set(), []

    def visit(name):
        if name in active:
            return active[active.index(name):] + [name]
        if name in done:
            return None
        active.append(name)
        for dep in sorted(graph.get(name, ())):
            if cycle := visit(dep):
                return cycle
        active.pop()
        done.add(name)
        return None

    return next((c for c in map(visit, sorted(graph)) if c), None)


def test_imports_within_kernels_are_at_module_level_and_acyclic():
    graph, nested = {}, []
    for name in MODULES:
        deps, where = kernel_imports(KERNELS / f"{name}.py")
        graph[name] = deps & set(MODULES)
        nested += where
    assert not nested, f"imports of kernels inside functions or blocks: {nested}"
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_checks_see_a_nested_import_and_a_cycle(tmp_path):
    (tmp_path / "a.py").write_text("from kernels.b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from kernels import a\n")
    (deps_a, nested_a), (deps_b, nested_b) = (kernel_imports(tmp_path / f) for f in ("a.py", "b.py"))
    assert (deps_a, nested_a, deps_b, nested_b) == ({"b"}, [], {"a"}, ["b.py:2"])
    assert find_cycle({"a": deps_a, "b": deps_b}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
