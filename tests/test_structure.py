"""The tree's structural rules, enforced (bin/test runs them with the rest):

- every module of provision/ and trainer/ opens with a docstring (its contract);
- no module over 400 lines, no function over 80 lines unless the comment block right above its `def` (or
  its first decorator) has a line starting `# long:` that gives the reason;
- provision/ never imports trainer/ (it runs before any trainer exists: on a bare login node, inside the
  worker simulation);
- no import cycles between the project's modules, type-only imports (`if TYPE_CHECKING:`) and the package
  `__init__`s an import runs included;
- trainer/'s top level holds packages and only the few modules several of its packages share;
- test-only hooks (`LINGBOT_TEST_*`) are read in trainer/testhooks.py only;
- every test is in exactly one lane, `fast` or `heavy` (tests/support/lanes.py fails the collection
  otherwise; checked here on a throwaway test dir).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("provision", "trainer")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80

pytestmark = pytest.mark.fast


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def test_every_module_opens_with_its_contract():
    missing = [
        str(p.relative_to(REPO))
        for p in modules().values()
        if not ast.get_docstring(ast.parse(p.read_text()))
    ]
    assert not missing, f"modules without a docstring (their contract): {missing}"


def test_modules_and_functions_stay_small():
    too_long = []
    for path in modules().values():
        lines = path.read_text().splitlines()
        rel = path.relative_to(REPO)
        if len(lines) > MAX_MODULE_LINES:
            too_long.append(f"{rel}: {len(lines)} lines (limit {MAX_MODULE_LINES}): split it by job")
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            above, k = [], first - 2  # the comment block right above the def (or its first decorator)
            while k >= 0 and lines[k].strip().startswith("#"):
                above.append(lines[k].strip())
                k -= 1
            if length > MAX_FUNCTION_LINES and not any(c.startswith("# long:") for c in above):
                too_long.append(
                    f"{rel}:{node.lineno} {node.name}: {length} lines (limit {MAX_FUNCTION_LINES}; "
                    "split it, or say why above it in a `# long: ...` comment)"
                )
    assert not too_long, "\n".join(too_long)


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules `name` imports, type-only imports (`if TYPE_CHECKING:`) included: a module that
    needs another's types for its annotations depends on it as much as one that calls it. Importing
    `a.b.c` also runs the packages `a` and `a.b` (their `__init__`), so they count as imported too, except
    the importer's own enclosing packages (already running when it is imported)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    enclosing = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    out: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            while target:
                if target != name and target not in enclosing:
                    out.add(target)
                target = target.rpartition(".")[0]
    return out


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: _imports(path, name, set(found)) for name, path in found.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[str]:
    cycles, state = [], dict.fromkeys(graph, 0)  # 0 new, 1 on the stack, 2 done

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state[t] == 1:
                cycles.append(" -> ".join([*stack[stack.index(t) :], t]))
            elif state[t] == 0:
                visit(t, [*stack, t])
        state[m] = 2

    for m in sorted(graph):
        if state[m] == 0:
            visit(m, [m])
    return cycles


def test_provision_never_imports_trainer_and_nothing_imports_in_a_cycle():
    graph = import_graph()
    wrong = sorted(f"{m} imports {t}" for m, ts in graph.items() if m.startswith("provision") for t in ts
                   if t.startswith("trainer"))  # fmt: skip
    assert not wrong, wrong
    cycles = find_cycles(graph)
    assert not cycles, "import cycles (type-only and package __init__s included):\n" + "\n".join(cycles)


def test_the_cycle_check_sees_type_only_imports_and_package_inits():
    """The rule can fail: a type-only import back, and an `__init__` that re-exports a module importing
    a sibling package that imports back, are both cycles."""
    assert find_cycles({"a": {"b"}, "b": {"a"}}) == ["a -> b -> a"]
    tree = REPO / "trainer" / "config" / "rules.py"
    assert "trainer.config.schema" in _imports(tree, "trainer.config.rules", set(modules()))
    # trainer.loop.train imports trainer.checkpoint.checkpointer: trainer/checkpoint/__init__.py runs too
    graph = import_graph()
    assert {"trainer.checkpoint", "trainer.checkpoint.checkpointer"} <= graph["trainer.loop.train"]


# The top level of trainer/ is packages plus these modules, each a contract between several packages.
SHARED_TOP_LEVEL = {
    "trainer.attempt": "the launcher <-> rank file protocol",
    "trainer.outcomes": "why a run failed beyond a rank's error (Diverged, Hung): ranks and launcher",
    "trainer.testhooks": "the one reader of the LINGBOT_TEST_* hooks",
}


def test_trainer_top_level_holds_packages_and_a_few_shared_modules():
    """A reader finds where X lives from the folder names: trainer/'s top level has packages and only
    the shared modules above, each imported by at least two of trainer's packages."""
    top = {p.stem for p in (REPO / "trainer").glob("*.py")} - {"__init__"}
    assert {f"trainer.{m}" for m in top} == set(SHARED_TOP_LEVEL), (
        "trainer/ holds modules beyond the shared ones: move them into the package that owns them "
        f"(found {sorted(top)})"
    )
    graph = import_graph()
    for shared in SHARED_TOP_LEVEL:
        users = {m.split(".")[1] for m, ts in graph.items() if shared in ts and m.count(".") >= 2}
        assert len(users) >= 2, f"{shared} is imported by {sorted(users)} only: move it into that package"


def test_test_hooks_live_in_one_module():
    """Only trainer/testhooks.py reads LINGBOT_TEST_* variables (code strings, not docstrings/comments)."""
    readers = []
    for name, path in modules().items():
        if name == "trainer.testhooks":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and "LINGBOT_TEST_" in node.value
                and id(node) not in docstrings
            ):
                readers.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not readers, f"LINGBOT_TEST_* read outside trainer/testhooks.py: {readers}"


def test_a_test_in_no_lane_or_both_fails_the_collection(tmp_path):
    """tests/support/lanes.py's hook (tests/conftest.py imports it) on a throwaway test dir: the run fails
    naming the test with no lane marker and the one with both, and not the one with exactly one."""
    import subprocess
    import sys

    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    fast: quick\n    heavy: slow\n")
    (tmp_path / "test_lanes.py").write_text(
        "import pytest\n"
        "def test_nowhere(): pass\n"
        "@pytest.mark.fast\n@pytest.mark.heavy\ndef test_both(): pass\n"
        "@pytest.mark.heavy\ndef test_one(): pass\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.lanes", "-c", str(tmp_path / "pytest.ini"),
         "--collect-only", "-q", "-m", "fast", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, out
    said = out.split("not in exactly one lane", 1)[-1]
    assert "test_lanes.py::test_nowhere: no lane marker" in said, out
    assert "test_lanes.py::test_both: both lane markers" in said, out
    assert "test_one" not in said, out
