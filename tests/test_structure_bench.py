"""bench/'s structural rules (tests/test_structure.py holds provision/'s and trainer/'s):

- bench/ never imports tests/: the test suite owns its fixtures and may change them at any time; a
  benchmark that needs one runs the tests' builder as a program (bench/common.py fixture_program);
- bench's modules import each other in no cycle (bench/gpu_measure.py holds what bench/gpu_check.py and
  bench/gpu_matrix.py share).

Every import counts: at module level or inside a function, `import bench.x`, `from bench import x`, and
the bare `import x` / `from x import ...` of a sibling that a script reaches through `sys.path`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.test_structure import find_cycles

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.fast


def _targets(tree: ast.AST) -> list[str]:
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif (
            isinstance(node, ast.ImportFrom) and node.level
        ):  # relative: `from . import x`, `from .x import y`
            out += [f"bench.{node.module or ''}".rstrip(".")] + [
                f"bench.{node.module + '.' if node.module else ''}{a.name}" for a in node.names
            ]
    return out


def bench_imports(bench: Path) -> tuple[dict[str, set[str]], list[str]]:
    """(bench module -> the bench modules it imports, the lines naming each import of tests/)."""
    modules = {p.stem: p for p in sorted(bench.glob("*.py")) if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    into_tests = []
    for stem, path in modules.items():
        name = f"bench.{stem}"
        graph[name] = set()
        for target in _targets(ast.parse(path.read_text())):
            parts = target.split(".")
            if parts[0] == "tests":
                into_tests.append(f"{path.name} imports {target}")
            elif parts[0] == "bench" and len(parts) > 1 and parts[1] in modules:
                graph[name].add(f"bench.{parts[1]}")
            elif parts[0] in modules:  # a sibling on sys.path
                graph[name].add(f"bench.{parts[0]}")
        graph[name].discard(name)
    return graph, sorted(set(into_tests))


def test_bench_never_imports_tests_and_its_modules_form_no_cycle():
    graph, into_tests = bench_imports(REPO / "bench")
    assert not into_tests, (
        "bench/ imports tests/ (run the tests' builder as a program: bench/common.py fixture_program):\n"
        + "\n".join(into_tests)
    )
    cycles = find_cycles(graph)
    assert not cycles, (
        "bench/ modules import each other in a cycle (move the shared part to one owner):\n"
        + ("\n".join(cycles))
    )


def test_the_bench_rules_can_fail(tmp_path):
    """A made-up bench/: a module importing tests/ inside a function, and a cycle through a bare sibling
    import (the sys.path way) and a package import, are both found; a clean import is not."""
    (tmp_path / "a.py").write_text("def f():\n    from tests.support.channel import index_channel\n")
    (tmp_path / "b.py").write_text("from bench.c import x\n")
    (tmp_path / "c.py").write_text("def g():\n    from b import y\n")
    (tmp_path / "d.py").write_text("from bench.c import x\nimport json\n")
    graph, into_tests = bench_imports(tmp_path)
    assert into_tests == [
        "a.py imports tests.support.channel",
        "a.py imports tests.support.channel.index_channel",
    ]
    assert find_cycles(graph) == ["bench.b -> bench.c -> bench.b"]
    assert graph["bench.d"] == {"bench.c"}
