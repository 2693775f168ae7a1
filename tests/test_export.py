"""Air-gapped install, end to end: `--export DIR` where the channel and the wheel index are reachable,
then `--from DIR` with both gone and no network at all (a network namespace without interfaces).

The env is real: a python env from a local channel (tests/support/python_pkg.py) with a locked pip
part from a local PEP 503 index (tests/support/wheels.py), locked by the project's own --relock.
"""

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
from provision.lockfile import read_lock
from tests.support.channel import index_channel
from tests.support.python_pkg import PY_MAJOR_MINOR, python_packages
from tests.support.wheels import write_simple_index, write_wheel

pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[1]


def run_cli(args: list[str], tmp: Path, *, no_network: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONDA_ENVS_PATH": str(tmp / "envs"), "LINGBOT_PKGS_DIR": str(tmp / "cache")}
    argv = [sys.executable, "-m", "provision.cli", *args]
    if no_network:
        argv = ["unshare", "-n", *argv]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _no_network_available() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.fixture
def project(tmp_path: Path) -> dict:
    """A reachable channel + wheel index, a spec using both, and its lock (by --relock)."""
    channel = tmp_path / "reachable" / "channel"
    (channel / "linux-64").mkdir(parents=True)
    for pkg in python_packages():
        try:
            os.link(pkg, channel / "linux-64" / pkg.name)
        except OSError:
            shutil.copy2(pkg, channel / "linux-64" / pkg.name)
    index_channel(channel)
    wheels = tmp_path / "reachable" / "wheels"
    alpha = write_wheel(wheels, "tinyalpha", "1.0", "VALUE = 'alpha-1.0'\n")
    beta = write_wheel(
        wheels,
        "tinybeta",
        "2.0",
        "import tinyalpha\nVALUE = 'beta+' + tinyalpha.VALUE\n",
        requires=["tinyalpha>=1.0"],
    )
    index_url = write_simple_index(tmp_path / "reachable" / "simple", [alpha, beta])
    spec = tmp_path / "project" / "environment.yml"
    spec.parent.mkdir()
    spec.write_text(
        textwrap.dedent(f"""\
        name: offline-env
        channels:
          - {channel}
        dependencies:
          - python {PY_MAJOR_MINOR}.*
          - pip
          - pip:
              - tinybeta==2.0
        """)
    )
    relock = run_cli(["-f", str(spec), "--relock", "--pip-index", index_url, "-q"], tmp_path)
    assert relock.returncode == 0, relock.stderr
    return {"spec": spec, "lock": spec.parent / "conda-lock.yml", "reachable": tmp_path / "reachable"}


def test_export_then_install_from_it_with_nothing_reachable(project, tmp_path):
    if not _no_network_available():
        pytest.skip("needs root and `unshare -n` to prove the install reaches nothing")
    spec, lock_path = project["spec"], project["lock"]
    lock = read_lock(lock_path)
    out = tmp_path / "kit"
    exported = run_cli(["offline-env", "-f", str(spec), "--export", str(out), "--json"], tmp_path)
    assert exported.returncode == 0, exported.stderr
    summary = json.loads(exported.stdout)
    assert summary["ok"] and summary["export"] == str(out)

    # exactly the locked files, verified, as an indexed channel + a wheel folder
    conda = {p.file_name for p in lock.for_platform("linux-64", "conda")}
    pip = {p.file_name for p in lock.for_platform("linux-64", "pip")}
    assert summary["conda"] == len(conda) and summary["pip"] == len(pip) == 2
    assert {p.name for p in (out / "channel" / "linux-64").glob("*.conda")} == conda
    assert {p.name for p in (out / "wheels").iterdir()} == pip
    repodata = json.loads((out / "channel" / "linux-64" / "repodata.json").read_text())
    assert set(repodata.get("packages.conda", {})) == conda
    assert (out / "channel" / "noarch" / "repodata.json").is_file()
    assert "--from" in (out / "README.md").read_text()
    assert (out / "conda-lock.yml").read_bytes() == lock_path.read_bytes()
    assert not list(tmp_path.glob("kit.partial-*"))

    # the channel and the index the lock points at are gone; the node has no network either
    shutil.rmtree(project["reachable"])
    direct = run_cli(["offline-env", "-f", str(spec), "-q"], tmp_path, no_network=True)
    assert direct.returncode == 2 and "does not exist" in direct.stderr  # the lock's own URLs are dead
    installed = run_cli(
        ["offline-env", "-f", str(spec), "--from", str(out), "--json"], tmp_path, no_network=True
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert json.loads(installed.stdout)["ok"]  # pip's own lines went to stderr: stdout is the object alone
    prefix = tmp_path / "envs" / "offline-env"
    assert prefixes.completeness(prefix) == (True, "")
    got = subprocess.run(
        [str(prefix / "bin" / "python"), "-I", "-c", "import tinybeta; print(tinybeta.VALUE)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.stdout.strip() == "beta+alpha-1.0", got.stderr


def test_tampered_export_and_foreign_lock_are_refused(project, tmp_path):
    spec = project["spec"]
    out = tmp_path / "kit"
    assert run_cli(["offline-env", "-f", str(spec), "--export", str(out), "-q"], tmp_path).returncode == 0
    again = run_cli(["offline-env", "-f", str(spec), "--export", str(out), "-q"], tmp_path)
    assert again.returncode == 2 and "exists" in again.stderr  # never written over

    wheel = next((out / "wheels").glob("tinyalpha-*.whl"))
    wheel.write_bytes(wheel.read_bytes() + b"tampered")
    refused = run_cli(["offline-env", "-f", str(spec), "--from", str(out)], tmp_path)
    assert refused.returncode == 2 and "hash" in refused.stderr.lower()
    assert not (tmp_path / "envs" / "offline-env").exists()

    other = tmp_path / "other-lock.yml"
    other.write_text(project["lock"].read_text() + "# another lock (same packages, other bytes)\n")
    foreign = run_cli(
        ["offline-env", "-f", str(spec), "--lockfile", str(other), "--from", str(out)], tmp_path
    )
    assert foreign.returncode == 2 and "was exported from a lock with sha256" in foreign.stderr


def test_export_of_a_corrupt_source_writes_nothing(project, tmp_path):
    spec = project["spec"]
    conda = read_lock(project["lock"]).for_platform("linux-64", "conda")
    victim = project["reachable"] / "channel" / "linux-64" / conda[0].file_name
    victim.unlink()  # a hard link into the fixture cache: replace, never write through it
    victim.write_bytes(b"not a package")
    out = tmp_path / "kit"
    proc = run_cli(["offline-env", "-f", str(spec), "--export", str(out)], tmp_path)
    assert (
        proc.returncode == 2
        and "does not match the lock" in proc.stderr
        and conda[0].file_name in proc.stderr
    )
    assert not out.exists() and not list(tmp_path.glob("kit.partial-*"))


def test_export_takes_the_wheels_from_pip_find_links_and_refuses_pip_index(project, tmp_path):
    """--export fetched every wheel by its locked URL whatever --pip-find-links said, then advised
    --pip-find-links when that URL was dead (found by a review); --pip-index was ignored without a word."""
    spec = project["spec"]
    mirror = tmp_path / "mirror"
    shutil.copytree(project["reachable"] / "wheels", mirror)
    shutil.rmtree(project["reachable"] / "simple")  # the lock's wheel URLs are dead now
    for wheel in (project["reachable"] / "wheels").iterdir():
        wheel.unlink()
    args = ["offline-env", "-f", str(spec), "--export", str(tmp_path / "kit"), "-q"]
    refused = run_cli([*args, "--pip-index", "http://127.0.0.1:9/simple"], tmp_path)
    assert refused.returncode == 2 and "give --pip-find-links instead" in refused.stderr, refused.stderr
    done = run_cli([*args, "--pip-find-links", str(mirror)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "kit" / "wheels").iterdir()) == sorted(
        p.name for p in mirror.iterdir()
    )


def test_a_killed_exports_partial_folder_is_removed_by_the_next_and_a_live_ones_kept(tmp_path):
    """`DIR.partial-<pid>` of an export that was killed stayed forever (the next run removed only its own
    pid's); a SIGTERM now ends bin/provision through its cleanup (provision/cli.py _stop_on_sigterm)."""
    import subprocess
    import sys

    from provision.export import _remove_dead_partials

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead, live = tmp_path / f"kit.partial-{gone.stdout.strip()}", tmp_path / f"kit.partial-{os.getppid()}"
    for partial in (dead, live):
        (partial / "channel").mkdir(parents=True)
    _remove_dead_partials(tmp_path / "kit")
    assert not dead.exists() and live.is_dir()
