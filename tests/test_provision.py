"""bin/provision from a local channel: the same code path as the real env (lock by --relock, install
by rattler from verified files), atomic under kill -9, idempotent, refusing tampered packages; and the
toolchain stand-in env compiling inside the compiler-less worker simulation."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from provision import prefix as prefixes
from provision.envvars import job_environment
from provision.install import generations_dir
from tests.support.channel import PREFIX_PLACEHOLDER, index_channel, make_package

REPO = Path(__file__).resolve().parents[1]
TOOL_PYTHON = sys.executable


def cli(args: list[str], tmp: Path) -> list[str]:
    return [sys.executable, "-m", "provision.cli", *args]


def cli_env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "CONDA_ENVS_PATH": str(tmp / "envs"), "LINGBOT_PKGS_DIR": str(tmp / "cache")}


def run_cli(args: list[str], tmp: Path, check: bool = False) -> subprocess.CompletedProcess:
    result = subprocess.run(
        cli(args, tmp), cwd=REPO, env=cli_env(tmp), capture_output=True, text=True, timeout=300
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{args} failed:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def small_channel(tmp_path_factory) -> Path:
    """Two packages, one rewriting its prefix, one with many files (so linking takes a while)."""
    channel = tmp_path_factory.mktemp("small-channel")
    make_package(
        channel / "linux-64",
        "hello",
        "1.0",
        {"bin/hello": f"#!/bin/sh\necho hello from {PREFIX_PLACEHOLDER}\n".encode()},
        has_prefix_text=["bin/hello"],
        depends=["bulk"],
    )
    make_package(
        channel / "noarch",
        "bulk",
        "1.0",
        {f"share/bulk/f{i:04d}.txt": f"file {i}\n".encode() * 50 for i in range(400)},
        noarch="generic",
    )
    index_channel(channel)
    return channel


def make_project(tmp: Path, channel: Path, name: str = "small-env") -> Path:
    """A spec + lock made by the project's own --relock, like the real environment.yml."""
    spec = tmp / "project" / "environment.yml"
    spec.parent.mkdir(parents=True)
    spec.write_text(
        textwrap.dedent(f"""\
        name: {name}
        channels:
          - {channel}
        dependencies:
          - hello
        variables:
          LINGBOT_GPU_KIND: cpu
          TRITON_CACHE_DIR: ${{HOME}}/.triton/cache_{name}_${{LINGBOT_GPU_KIND}}
        """)
    )
    run_cli(["-f", str(spec), "--relock", "-q"], tmp, check=True)
    return spec


def assert_intact(env: Path) -> dict:
    """A complete env whose files are all there with the right contents; returns its manifest."""
    ok, reason = prefixes.completeness(env)
    assert ok, reason
    manifest = prefixes.read_manifest(env)
    gen = manifest["generation"]
    assert (
        subprocess.run([str(env / "bin" / "hello")], capture_output=True, text=True).stdout
        == f"hello from {gen}\n"
    )
    bulk = sorted((env / "share" / "bulk").iterdir())
    assert len(bulk) == 400 and bulk[7].read_text() == "file 7\n" * 50
    return manifest


@pytest.mark.heavy
def test_provision_installs_the_lock_and_a_rerun_is_a_noop(tmp_path, small_channel):
    spec = make_project(tmp_path, small_channel)
    env = tmp_path / "envs" / "small-env"
    first = json.loads(run_cli(["small-env", "-f", str(spec), "--json", "-q"], tmp_path, check=True).stdout)
    assert first["action"] == "provisioned" and first["packages"] == 2
    manifest = assert_intact(env)
    assert env.is_symlink() and manifest["packages"][0]["sha256"]
    second = json.loads(run_cli(["small-env", "-f", str(spec), "--json", "-q"], tmp_path, check=True).stdout)
    assert second["action"] == "up-to-date"
    assert prefixes.read_manifest(env) == manifest  # nothing was rebuilt

    # a changed variable needs no relock but a new generation with the new value
    spec.write_text(spec.read_text().replace("LINGBOT_GPU_KIND: cpu", "LINGBOT_GPU_KIND: h200"))
    third = json.loads(run_cli(["small-env", "-f", str(spec), "--json", "-q"], tmp_path, check=True).stdout)
    assert third["action"] == "provisioned"
    assert "LINGBOT_GPU_KIND h200" in (env / "etc/lingbot/env-vars").read_text()
    # the previous generation stays, complete, for jobs started from it; the one before it would not
    assert prefixes.completeness(Path(manifest["generation"]))[0]
    assert sorted(p.name for p in generations_dir(env).iterdir()) == sorted(
        [Path(os.path.realpath(env)).name, Path(manifest["generation"]).name]
    )


@pytest.mark.heavy
def test_tampered_package_is_refused_naming_the_file(tmp_path, small_channel):
    spec = make_project(tmp_path, small_channel)
    mirror = tmp_path / "mirror"
    shutil.copytree(small_channel, mirror)
    tampered = mirror / "linux-64" / "hello-1.0-0.conda"
    tampered.write_bytes(tampered.read_bytes() + b"\0")
    result = run_cli(["-f", str(spec), "--channel", str(mirror)], tmp_path)
    assert result.returncode == 2
    assert f"package file {tampered} does not match the lock" in result.stderr
    assert not (tmp_path / "envs" / "small-env").exists()
    assert not any(generations_dir(tmp_path / "envs" / "small-env").iterdir())  # no partial build left
    # both hashes are checked and reported (py-rattler checks neither for file:// packages)
    assert "md5" in result.stderr and "sha256" in result.stderr


@pytest.mark.heavy
def test_existing_directory_not_made_by_provision_is_refused(tmp_path, small_channel):
    spec = make_project(tmp_path, small_channel)
    foreign = tmp_path / "envs" / "small-env"
    (foreign / "conda-meta").mkdir(parents=True)
    result = run_cli(["-f", str(spec)], tmp_path)
    assert result.returncode == 2 and "was not made by bin/provision" in result.stderr
    assert (foreign / "conda-meta").is_dir()


@pytest.mark.heavy
@pytest.mark.slow
def test_kill_9_at_random_points_never_yields_a_complete_looking_broken_env(tmp_path, small_channel):
    spec = make_project(tmp_path, small_channel)
    env = tmp_path / "envs" / "small-env"
    args = cli(["-f", str(spec), "--force", "-q"], tmp_path)

    # a first provision killed mid-way leaves nothing complete-looking at the name
    start = time.monotonic()
    run_cli(["-f", str(spec), "--force", "-q"], tmp_path, check=True)
    duration = time.monotonic() - start
    shutil.rmtree(tmp_path / "envs")

    rng = random.Random(20240611)
    trials, outcomes = 24, {"old": 0, "new": 0, "none": 0}

    def trial(delay: float) -> None:
        had_env = env.is_symlink()
        before = prefixes.read_manifest(env)["generation"] if had_env else None
        proc = subprocess.Popen(
            args, cwd=REPO, env=cli_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(delay)  # the kill point itself is what is varied here, not a wait for an event
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        ok, reason = prefixes.completeness(env)
        if not had_env:
            if ok:
                assert_intact(env)
                outcomes["new"] += 1
            else:
                assert not env.exists() or "manifest" in reason
                outcomes["none"] += 1
            return
        # the previous good env (or the complete new one) is what the name points at, intact
        manifest = assert_intact(env)
        outcomes["old" if manifest["generation"] == before else "new"] += 1

    # spread the kills over the whole run (startup, verify, link, hooks, manifest, swap) + jitter
    for i in range(trials):
        trial(duration * (i + rng.random()) / trials)
    # A loaded host can make every run slower than the reference one, so that no kill landed after a
    # switch: then later kill points (2x, 4x, ... the reference) until one does, at most 5 more.
    for extra in range(5):
        if outcomes["new"]:
            break
        trial(duration * 2 ** (extra + 1))
    final = json.loads(run_cli(["-f", str(spec), "--json", "-q"], tmp_path, check=True).stdout)
    assert final["action"] in ("provisioned", "up-to-date")
    assert_intact(env)
    kept = os.path.realpath(env)
    run_cli(["-f", str(spec), "--force", "-q"], tmp_path, check=True)  # cleans every leftover
    # what is left: the new generation and the one it replaced (kept for running jobs)
    assert sorted(p.name for p in generations_dir(env).iterdir()) == sorted(
        [Path(os.path.realpath(env)).name, Path(kept).name]
    )
    assert not list(env.parent.glob(".small-env.link-*"))
    # kills landed both before and after the switch
    assert outcomes["old"] + outcomes["none"] > 0 and outcomes["new"] > 0, outcomes


# --- the toolchain env inside the worker simulation -----------------------------------------------

C_EXTENSION = r"""
#include <Python.h>
static PyObject *add(PyObject *self, PyObject *args) {
    long a, b;
    if (!PyArg_ParseTuple(args, "ll", &a, &b)) return NULL;
    return PyLong_FromLong(a + b);
}
static PyMethodDef methods[] = {{"add", add, METH_VARARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "lingbot_ext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_lingbot_ext(void) { return PyModule_Create(&module); }
"""

COMPILE_PROBE = r"""
import os, subprocess, sys, sysconfig, tempfile
work = tempfile.mkdtemp()
src = os.path.join(work, "ext.c")
open(src, "w").write(sys.argv[1])
so = os.path.join(work, "lingbot_ext" + sysconfig.get_config_var("EXT_SUFFIX"))
# the way setuptools builds an extension: $CC, python's headers, -shared -fPIC
subprocess.run([os.environ["CC"], "-shared", "-fPIC", "-O2", "-I", sysconfig.get_paths()["include"], src,
                "-o", so], check=True)
sys.path.insert(0, work)
import lingbot_ext
assert lingbot_ext.add(2, 40) == 42
# torch.compile with these compilers in the worker, activated and not, is tests/test_envcheck.py's
# (test_worker_with_toolchain_passes_not_activated / _activated: compile.inductor_cpp and the other rows)
print("CC=" + os.environ["CC"])
print("CXX=" + os.environ["CXX"])
print("COMPILED-OK")
"""


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.worker
def test_toolchain_env_compiles_in_the_worker_activated_and_not(
    tmp_path, toolchain_channel, worker, worker_env
):
    spec = tmp_path / "project" / "environment.yml"
    spec.parent.mkdir()
    spec.write_text(
        textwrap.dedent(f"""\
        name: tool-env
        channels:
          - {toolchain_channel}
        dependencies:
          - gcc_linux-64
          - gxx_linux-64
          - sysroot_linux-64
          - lingbot-probe
        variables:
          LINGBOT_GPU_KIND: cpu
          TRITON_CACHE_DIR: ${{HOME}}/.triton/cache_tool-env_${{LINGBOT_GPU_KIND}}
        """)
    )
    run_cli(["-f", str(spec), "--relock", "-q"], tmp_path, check=True)
    run_cli(["-f", str(spec), "-q"], tmp_path, check=True)
    env = tmp_path / "envs" / "tool-env"
    assert prefixes.completeness(env) == (True, "")
    cc = f"{env}/bin/x86_64-conda-linux-gnu-cc"
    # every run compiles for itself: no Inductor/FX cache hit can stand in for a working compiler
    worker_env = {**worker_env, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}

    # not activated: `srun $PREFIX/bin/python`-style, the environment from the env's one variables file
    plain = worker.run(
        [TOOL_PYTHON, "-c", COMPILE_PROBE, C_EXTENSION],
        env=job_environment(env, {**worker_env, "CC": "/usr/bin/gcc"}),
        timeout=600,
    )
    assert "COMPILED-OK" in plain.stdout, plain.stdout + plain.stderr
    assert f"CC={cc}" in plain.stdout

    # activated like `conda activate`: activate.d in order, then deactivate.d in reverse order
    shell = textwrap.dedent("""\
        show() { printf 'CC=%s|%s CXX=%s|%s CPATH=%s|%s\\n' "${CC-unset}" "${CC+x}" \
            "${CXX-unset}" "${CXX+x}" "${CPATH-unset}" "${CPATH+x}"; }
        show
        export CONDA_PREFIX="$1"; export PATH="$1/bin:$PATH"
        for s in "$1"/etc/conda/activate.d/*.sh; do . "$s"; done
        "$2" -c "$3" "$4" || exit 1
        for s in $(ls -r "$1"/etc/conda/deactivate.d/*.sh); do . "$s"; done
        show
        """)
    base = {**worker_env, "CC": "/usr/bin/gcc", "CPATH": ""}
    active = worker.run(
        ["sh", "-c", shell, "sh", str(env), TOOL_PYTHON, COMPILE_PROBE, C_EXTENSION], env=base, timeout=600
    )
    assert "COMPILED-OK" in active.stdout, active.stdout + active.stderr
    assert f"CC={cc}" in active.stdout  # the user's CC=/usr/bin/gcc did not win
    lines = [line for line in active.stdout.splitlines() if line.startswith("CC=") and "|" in line]
    assert lines[0] == lines[-1] == "CC=/usr/bin/gcc|x CXX=unset| CPATH=|x", lines


@pytest.mark.fast
def test_a_local_projects_in_tree_builds_take_turns_and_leave_nothing(tmp_path):
    """Two provisions of different envs (each with its own env lock) from one checkout: setuptools builds
    the checkout in its own tree, and the first to finish removed build/ under the other's build. The
    in-tree build holds a flock on the project's PROJECT_BUILD_LOCK; what it made is removed after it,
    what was there before stays."""
    import fcntl
    import threading

    from provision.plan import ProvisionError
    from provision.project import PROJECT_BUILD_LOCK, in_tree_build

    project = tmp_path / "checkout"
    (project / "old.egg-info").mkdir(parents=True)  # there before: left as it was
    second_in, second_saw = threading.Event(), []

    def second() -> None:
        with in_tree_build(project):
            second_saw.append(sorted(p.name for p in project.iterdir()))
            second_in.set()

    with in_tree_build(project):
        (project / "build" / "lib").mkdir(parents=True)
        (project / "new.egg-info").mkdir()
        other = threading.Thread(target=second)
        other.start()
        with open(project / PROJECT_BUILD_LOCK) as probe:  # the lock is held: another taker would wait
            with pytest.raises(BlockingIOError):
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert not second_in.is_set() and (project / "build" / "lib").is_dir()
    other.join(timeout=30)
    assert second_in.is_set()  # it went in only after the first was done and had cleaned up
    assert second_saw == [[PROJECT_BUILD_LOCK, "old.egg-info"]]
    assert sorted(p.name for p in project.iterdir()) == [PROJECT_BUILD_LOCK, "old.egg-info"]
    with in_tree_build(tmp_path / "tiny-1.0.whl"):  # not a folder: pip builds nothing in it
        pass
    (tmp_path / "odd" / PROJECT_BUILD_LOCK).mkdir(parents=True)  # a lock that cannot be opened: one line
    with pytest.raises(ProvisionError, match=r"cannot open the build lock .* \(--no-project\)"):
        with in_tree_build(tmp_path / "odd"):
            pass


@pytest.mark.fast
def test_the_source_copy_for_another_platforms_wheel_leaves_out_build_outputs(tmp_path):
    """The cross-platform wheel is built from git's view of the checkout; a build/ there (another
    provision's in-tree build running, or one left behind) is untracked and not ignored, and went into the
    wheel: modules since removed, or a copy failing mid-way (found by a review)."""
    from provision.project import source_copy

    project = tmp_path / "checkout"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "__init__.py").write_text("")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=project, check=True)
    subprocess.run([*git, "add", "pkg"], cwd=project, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=project, check=True)
    (project / "tools" / "build").mkdir(parents=True)  # a tracked build/ of its own is source: kept
    (project / "tools" / "build" / "run.py").write_text("")
    subprocess.run([*git, "add", "tools"], cwd=project, check=True)
    subprocess.run([*git, "commit", "-qm", "tools"], cwd=project, check=True)
    for litter in ("build/lib/pkg/removed.py", "dist/pkg-0.whl", "pkg.egg-info/PKG-INFO"):
        (project / litter).parent.mkdir(parents=True, exist_ok=True)
        (project / litter).write_text("")
    (project / "pkg" / "new.py").write_text("")  # untracked source: part of the build, as before
    copy = source_copy(project, tmp_path / "copy")
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file()) == [
        "pkg/__init__.py",
        "pkg/new.py",
        "tools/build/run.py",
    ]
