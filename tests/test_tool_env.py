"""bin/_tool_env.sh on a node that lacks the Python the tool environment was built with (a worker):
the complete .venv is left alone and the provisioned env's python runs the command, or it fails clearly."""

import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]


def make_checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / "bin").mkdir(parents=True)
    for name in ("_tool_env.sh", "envcheck"):
        shutil.copy2(REPO / "bin" / name, root / "bin" / name)
    shutil.copy2(REPO / "pyproject.toml", root / "pyproject.toml")
    venv_bin = root / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to("/nonexistent/python3.11")  # the login node's interpreter
    digest = hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()
    (root / ".venv" / ".lingbot-ready").write_text(digest)
    return root


def fake_env_python(tmp_path: Path) -> Path:
    python = tmp_path / "env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\necho "env-python $*"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return python


def run(root: Path, env_extra: dict) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": str(root.parent / "home"), **env_extra}
    return subprocess.run(
        [str(root / "bin" / "envcheck"), "--worker"], env=env, capture_output=True, text=True, timeout=60
    )


def test_worker_without_the_venv_python_uses_the_provisioned_env(tmp_path):
    root = make_checkout(tmp_path)
    python = fake_env_python(tmp_path)
    proc = run(root, {"LINGBOT_ENV_PYTHON": str(python)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "env-python -m provision.check --worker"
    assert "cannot run on this node" in proc.stderr
    assert (root / ".venv" / ".lingbot-ready").exists()  # the shared .venv was not rebuilt or removed


def test_worker_without_any_usable_python_fails_clearly_and_keeps_the_venv(tmp_path):
    root = make_checkout(tmp_path)
    proc = run(root, {})
    assert proc.returncode == 2
    assert "bin/provision lingbot-b200" in proc.stderr and "LINGBOT_ENV_PYTHON" in proc.stderr
    assert (root / ".venv" / ".lingbot-ready").exists() and (root / ".venv" / "bin" / "python").is_symlink()
