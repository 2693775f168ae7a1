"""Every command the documents show (README.md and docs/*.md) names a program that exists and only flags
that program accepts.

Commands are taken from fenced `sh` blocks (one per line, `\\` continuations joined, `# comments` cut) and
from inline code spans that start with a known program. Checked: the program exists (`bin/<tool>` an
executable file, `python -m <module>` a module of this tree or an installed one, `pytest tests/<file>` a
file), and every `--flag` belongs to the program's own `--help` (for `torchrun ... -m MODULE ARGS`, the
flags before `-m` are torchrun's and the ones after are MODULE's). Positional values and machine-specific
paths (`/media/kit`, `/models/...`) are not checked: they are examples a reader replaces.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# what each bin/ entry point execs (its own help is that module's)
BIN_MODULE = {
    "train": "trainer.launcher",
    "provision": "provision.cli",
    "envcheck": "provision.check",
    "evaluate": "trainer.evaluation.cli",
    "serve": "trainer.serving.cli",
}
FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9-]*")
FENCE = re.compile(r"^```(\w*)\s*$")
INLINE = re.compile(r"`([^`\n]+)`")
PROGRAM = re.compile(
    r"^(?:[A-Z_]+=\S+\s+)*(bin/\w+(?![\w./])|(?:\.venv/bin/)?python3? -m [\w.]+|torchrun|bash \.ci/run)"
)


def documented_commands() -> list[tuple[str, str]]:
    """(where, command) for every command line of the documents."""
    found = []
    for doc in DOCUMENTS:
        lines = doc.read_text().splitlines()
        fence, pending = None, ""
        for n, line in enumerate(lines, 1):
            where = f"{doc.relative_to(REPO)}:{n}"
            opened = FENCE.match(line.strip())
            if opened:
                fence = None if fence is not None else opened.group(1)
                continue
            if fence in ("sh", "bash", "console"):
                text = pending + line.split(" #", 1)[0].strip()
                if text.endswith("\\"):
                    pending = text[:-1] + " "
                    continue
                pending = ""
                if PROGRAM.match(text):
                    found.append((where, text))
            elif fence is None:
                found += [(where, span) for span in INLINE.findall(line) if PROGRAM.match(span)]
    return found


@functools.cache
def help_flags(module: str) -> frozenset[str]:
    """The --flags `python -m MODULE --help` lists. Run in this process (runpy: the CLI modules are
    argparse/click entry points that print their help and exit before doing anything else), except
    pytest, which must not start a session inside this one."""
    if module == "pytest":
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"pytest --help exited {done.returncode}: {done.stderr[-2000:]}"
        text = done.stdout
    else:
        out, argv, code = io.StringIO(), sys.argv, None
        sys.argv = [module, "--help"]
        try:
            with contextlib.redirect_stdout(out):
                runpy.run_module(module, run_name="__main__", alter_sys=False)
        except SystemExit as exc:  # argparse/click exit after the help (torchrun's @record swallows it)
            code = exc.code
        finally:
            sys.argv = argv
        assert code in (0, None), f"python -m {module} --help exited {code}"
        text = out.getvalue()
    flags = frozenset(FLAG.findall(text))
    assert "--help" in flags, f"python -m {module} --help printed no flags:\n{text}"
    return flags


def module_exists(module: str) -> bool:
    if (REPO / Path(*module.split("."))).with_suffix(".py").is_file():
        return True
    if (REPO / Path(*module.split(".")) / "__main__.py").is_file():
        return True
    return (
        importlib.util.find_spec(module.split(".")[0]) is not None
        and importlib.util.find_spec(module) is not None
    )


def problems(command: str) -> list[str]:
    """What is wrong with one documented command (empty: nothing found)."""
    words = [w for w in shlex.split(command, comments=True) if not re.match(r"^[A-Z_]+=", w)]
    if words[:2] == ["bash", ".ci/run"]:
        return [] if (REPO / ".ci" / "run").is_file() else [".ci/run does not exist"]
    parts: list[tuple[str, list[str]]] = []  # (module whose help applies, its words)
    if words[0].startswith("bin/"):
        tool = words[0].removeprefix("bin/")
        if not os.access(REPO / "bin" / tool, os.X_OK):
            return [f"{words[0]} is not an executable file of this tree"]
        if tool == "test":  # bin/test [--fast | --aarch64 | --setup | ...] [PYTEST ARGS]: modes read from it
            rest = words[1:]
            modes = re.findall(r"^\s*(--[a-z0-9-]+)\)", (REPO / "bin" / "test").read_text(), re.M)
            if rest[:1] and rest[0] in modes:
                rest = rest[1:]
            parts.append(("pytest", rest))
        elif tool in BIN_MODULE:
            parts.append((BIN_MODULE[tool], words[1:]))
        else:
            return [f"{words[0]}: no help module known to this test (add it to BIN_MODULE)"]
    elif words[0] == "torchrun":
        if "-m" not in words:
            return ["torchrun without -m MODULE"]
        at = words.index("-m")
        parts += [("torch.distributed.run", words[1:at]), (words[at + 1], words[at + 2 :])]
    else:  # [.venv/bin/]python -m MODULE ARGS
        parts.append((words[2], words[3:]))
    wrong = []
    for module, args in parts:
        if not module_exists(module):
            wrong.append(f"no module {module}")
            continue
        if module == "pytest":
            wrong += [
                f"no file {a}"
                for a in args
                if a.startswith("tests/") and not (REPO / a.split("::")[0]).exists()
            ]
        known = help_flags(module)
        wrong += [
            f"{module} has no option {flag}" for flag in FLAG.findall(" ".join(args)) if flag not in known
        ]
    return wrong


def test_the_documents_show_commands():
    """The extraction finds the commands (an empty list would pass the check below vacuously)."""
    commands = [c for _, c in documented_commands()]
    for program in (
        "bin/train",
        "bin/provision",
        "bin/envcheck",
        "bin/test",
        "python -m trainer.data.cache.prepare",
    ):
        assert any(c.startswith(program) for c in commands), (program, commands)


def test_every_documented_command_names_a_real_program_and_real_flags():
    wrong = [f"{where}: `{command}`: {'; '.join(found)}" for where, command in documented_commands()
             if (found := problems(command))]  # fmt: skip
    assert not wrong, "documented commands that would not run as written:\n" + "\n".join(wrong)


def test_a_wrong_flag_or_program_is_caught():
    assert problems("bin/train furniture_train 2 --no-such-flag") == [
        "trainer.launcher has no option --no-such-flag"
    ]
    assert problems("bin/nothing here") == ["bin/nothing is not an executable file of this tree"]
    assert problems("python -m trainer.no_such_module --x") == ["no module trainer.no_such_module"]
    assert problems("torchrun --nproc-per-node 8 -m trainer.data.cache.prepare --config x --set a=1") == []
