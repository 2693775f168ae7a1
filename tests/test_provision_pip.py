"""The pip step of bin/provision with a real python in the env: the locked pip part (locked by --relock
against a local simple index, installed with the env's own python, --no-deps, hashes required) and
the spec's local project path (--no-build-isolation, --no-index)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from provision import prefix as prefixes
from provision.install import generations_dir
from provision.project import PROJECT_BUILD_LOCK
from tests.support.channel import index_channel
from tests.support.python_pkg import PY_MAJOR_MINOR, python_packages
from tests.support.wheels import sha256_of, write_simple_index, write_wheel

pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[1]
ENV_NAME = "pip-env"


def run_cli(args: list[str], tmp: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONDA_ENVS_PATH": str(tmp / "envs"), "LINGBOT_PKGS_DIR": str(tmp / "cache")}
    result = subprocess.run(
        [sys.executable, "-m", "provision.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{args} failed:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def python_channel(tmp_path_factory) -> Path:
    channel = tmp_path_factory.mktemp("python-channel")
    (channel / "linux-64").mkdir()
    for pkg in python_packages():
        try:
            os.link(pkg, channel / "linux-64" / pkg.name)
        except OSError:
            shutil.copy2(pkg, channel / "linux-64" / pkg.name)
    index_channel(channel)
    return channel


def env_python(prefix: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    # -I: no PYTHONPATH, no user site, not the cwd: only what is installed in the env
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "CONDA"))}
    return subprocess.run(
        [str(prefix / "bin" / "python"), "-I", "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_pip_part_locked_installed_with_hashes_and_local_project(python_channel: Path, tmp_path: Path):
    wheels = tmp_path / "wheels"
    alpha = write_wheel(wheels, "tinyalpha", "1.0", "VALUE = 'alpha-1.0'\n")
    beta = write_wheel(
        wheels,
        "tinybeta",
        "2.0",
        "import tinyalpha\nVALUE = 'beta+' + tinyalpha.VALUE\n",
        requires=["tinyalpha>=1.0"],
    )
    index_url = write_simple_index(tmp_path / "simple", [alpha, beta])

    project = tmp_path / "project"
    tiny = project / "tinyproject"
    tiny.mkdir(parents=True)
    (tiny / "tinyproject.py").write_text("VALUE = 'tinyproject-0.1'\n")
    (tiny / "pyproject.toml").write_text(
        textwrap.dedent("""\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "tinyproject"
        version = "0.1"

        [tool.setuptools]
        py-modules = ["tinyproject"]
        """)
    )
    spec = project / "environment.yml"
    spec.write_text(
        textwrap.dedent(f"""\
        name: {ENV_NAME}
        channels:
          - {python_channel}
        dependencies:
          - python {PY_MAJOR_MINOR}.*
          - pip
          - pip:
              - tinybeta==2.0
              - ./tinyproject
        """)
    )

    # lock: the pip part resolved (tinyalpha comes in as tinybeta's dependency) with the index's hashes
    run_cli(["-f", str(spec), "--relock", "--pip-index", index_url, "-q"], tmp_path)
    from conda_lock.lockfile import parse_conda_lock_file

    lock = parse_conda_lock_file(project / "conda-lock.yml")
    locked_pip = {d.name: d for d in lock.package if d.manager == "pip"}
    assert set(locked_pip) == {"tinyalpha", "tinybeta"}, "the local project is not locked; its deps are"
    assert locked_pip["tinyalpha"].hash.sha256 == sha256_of(alpha)
    assert locked_pip["tinybeta"].hash.sha256 == sha256_of(beta)
    assert {d.name for d in lock.package if d.manager == "conda"} >= {"python", "pip", "setuptools"}

    install = ["-f", str(spec), "--channel", str(python_channel), "--pip-find-links", str(wheels), "-q"]
    done = run_cli([*install, "--json"], tmp_path)
    assert json.loads(done.stdout)["ok"]  # pip's lines went to stderr: stdout is the object alone
    # setuptools built the project in its tree; what that left there (build/, *.egg-info) is gone again,
    # but for the lock file the in-tree builds take turns on
    assert sorted(p.name for p in tiny.iterdir()) == [PROJECT_BUILD_LOCK, "pyproject.toml", "tinyproject.py"]
    prefix = tmp_path / "envs" / ENV_NAME
    ok, reason = prefixes.completeness(prefix)
    assert ok, reason
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    # the interpreter is the env's own: its prefix is the env and its libpython comes from the env
    code = (
        "import sys, sysconfig; print(sys.prefix); print(sys.executable); "
        "print(sysconfig.get_config_var('LIBDIR'))"
    )
    got = env_python(prefix, code, elsewhere)
    assert got.returncode == 0, got.stderr
    sys_prefix, executable, libdir = got.stdout.splitlines()
    assert (sys_prefix, executable) == (str(prefix), str(prefix / "bin" / "python"))
    assert Path(libdir).resolve() == (prefix / "lib").resolve(), "_sysconfigdata's prefix was not rewritten"
    if shutil.which("ldd"):
        ldd = subprocess.run(["ldd", str(prefix / "bin" / "python")], capture_output=True, text=True).stdout
        for line in (line for line in ldd.splitlines() if "libpython" in line):  # none: a static python
            assert Path(line.split("=>")[1].split()[0]).resolve().is_relative_to(prefix.resolve()), ldd

    # the locked wheels and the local project import from the env's site-packages, no PYTHONPATH
    code = (
        "import tinyalpha, tinybeta, tinyproject, sys\n"
        "print(tinybeta.VALUE, tinyproject.VALUE)\n"
        "for m in (tinyalpha, tinybeta, tinyproject): print(m.__file__)"
    )
    got = env_python(prefix, code, elsewhere)
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    assert lines[0] == "beta+alpha-1.0 tinyproject-0.1"
    site = (prefix / "lib" / f"python{PY_MAJOR_MINOR}" / "site-packages").resolve()
    for path in lines[1:]:
        assert Path(path).resolve().parent == site, path

    # pip got the lock's hashes, and the manifest lists the pip packages with them
    reqs = (prefix / "conda-meta" / "lingbot-pip-requirements.txt").read_text()
    assert f"tinyalpha==1.0 --hash=sha256:{sha256_of(alpha)}" in reqs
    manifest = prefixes.read_manifest(prefix)
    assert sorted(manifest["pip"], key=lambda e: e["name"]) == [
        {"name": "tinyalpha", "version": "1.0", "sha256": sha256_of(alpha)},
        {"name": "tinybeta", "version": "2.0", "sha256": sha256_of(beta)},
    ]
    assert {p["name"] for p in manifest["packages"]} == {"python", "pip", "setuptools"}
    generation = os.path.realpath(prefix)

    # a tampered wheel under the locked name is refused; the previous env is untouched
    assert write_wheel(wheels, "tinyalpha", "1.0", "VALUE = 'evil'\n") == alpha  # same file name
    assert sha256_of(alpha) != locked_pip["tinyalpha"].hash.sha256
    refused = run_cli(install + ["--force"], tmp_path, check=False)
    assert refused.returncode != 0, refused.stdout
    assert "hash" in refused.stderr.lower() and "tinyalpha" in refused.stderr, refused.stderr[-3000:]
    assert os.path.realpath(prefix) == generation
    assert [p.name for p in generations_dir(prefix).iterdir()] == [Path(generation).name]
    assert prefixes.completeness(prefix) == (True, "")
    assert prefixes.read_manifest(prefix) == manifest
    got = env_python(prefix, "import tinyalpha; print(tinyalpha.VALUE)", elsewhere)
    assert got.stdout.strip() == "alpha-1.0", got.stderr
