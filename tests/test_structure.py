"""The tree's structural rules, enforced (bin/test runs them with the rest):

- every module of provision/ and trainer/ opens with a docstring (its contract);
- no module over 400 lines, no function over 80 lines unless the comment block right above its `def` (or
  its first decorator) has a line starting `# long:` that gives the reason;
- provision/ never imports trainer/ (it runs before any trainer exists: on a bare login node, inside the
  worker simulation);
- no import cycles between the project's modules (imports under `if TYPE_CHECKING:` excluded: they never
  run);
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
    """The project modules `name` imports at run time (not under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text())
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
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
            if target and target != name:
                out.add(target)
    return out


def test_provision_never_imports_trainer_and_nothing_imports_in_a_cycle():
    found = modules()
    graph = {name: _imports(path, name, set(found)) for name, path in found.items()}
    wrong = sorted(f"{m} imports {t}" for m, ts in graph.items() if m.startswith("provision") for t in ts
                   if t.startswith("trainer"))  # fmt: skip
    assert not wrong, wrong

    # a package importing its own submodules (its __init__ re-exporting them) is not a cycle
    def edges(m: str) -> set[str]:
        return {t for t in graph[m] if not m.startswith(t + ".")}

    cycles, state = [], dict.fromkeys(graph, 0)  # 0 new, 1 on the stack, 2 done

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for t in sorted(edges(m)):
            if state[t] == 1:
                cycles.append(" -> ".join([*stack[stack.index(t) :], t]))
            elif state[t] == 0:
                visit(t, [*stack, t])
        state[m] = 2

    for m in sorted(graph):
        if state[m] == 0:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


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
