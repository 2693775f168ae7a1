"""bin/provision --platform for another architecture (an aarch64 env for Grace nodes from an x86 login
node): planned with no emulation, since this machine installs the pip part and the checkout itself
(provision/wheel_install.py: its own pip for the target's wheels, pypa's installer to unpack them, the
env's python never run); refused only where this machine cannot install those wheels; never over an env
of another platform. The end-to-end install is tests/test_provision_crossarch.py."""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from pathlib import Path

import pytest

from provision import crossarch, wheel_install
from provision.install import plan
from provision.lock import current_platform, read_lock
from provision.pip_lock import pip_arch, requirement_lines
from provision.plan import ProvisionError
from provision.prefix import manifest_path
from provision.spec import load_spec
from tests.support.wheels import write_wheel

REPO = Path(__file__).resolve().parents[1]
FOREIGN = "linux-aarch64" if current_platform() != "linux-aarch64" else "linux-64"
ARCH = pip_arch(FOREIGN)  # its wheels' machine: aarch64 (x86_64 on an aarch64 host)


@pytest.mark.fast
def test_foreign_env_with_a_pip_part_is_planned_without_emulation(tmp_path, monkeypatch):
    # neither qemu nor the target's glibc loader is usable here: nothing may need to run the env's python
    monkeypatch.setenv("QEMU_LD_PREFIX", str(tmp_path / "no-target-libc"))
    spec = load_spec(REPO / "environment.yml")
    the_plan = plan(spec, None, REPO / "conda-lock.yml", tmp_path / "env", FOREIGN, log=lambda _: None)
    assert the_plan.platform == FOREIGN
    assert the_plan.lock.for_platform(FOREIGN, "pip"), "the repo lock's pip part, installed from this host"
    assert the_plan.projects == [REPO]  # this checkout too
    assert not (tmp_path / "env").exists()


@pytest.mark.fast
def test_foreign_env_is_refused_only_where_this_machine_cannot_install_its_wheels(tmp_path, monkeypatch):
    spec = load_spec(REPO / "environment.yml")
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "installer", None)  # this python without pypa's installer
        with pytest.raises(ProvisionError) as info:
            plan(spec, None, REPO / "conda-lock.yml", tmp_path / "env", FOREIGN, log=lambda _: None)
        message = str(info.value)
        assert f"the env is for {FOREIGN}" in message and "the pip part" in message
        assert "pypa's `installer`" in message and "tool env" in message
        assert crossarch.host_install_refusal(FOREIGN, []) == ""  # no pip step: nothing to install
        assert crossarch.host_install_refusal(current_platform(), ["the pip part"]) == ""  # the env's own pip
    assert not (tmp_path / "env").exists()
    assert crossarch.host_install_refusal(FOREIGN, ["the pip part"]) == ""
    no_tags = crossarch.host_install_refusal("osx-arm64", ["the pip part"])
    assert "wheel tags of linux-64, linux-aarch64" in no_tags and "on a osx-arm64 machine" in no_tags


@pytest.mark.fast
def test_the_host_downloads_exactly_the_locked_wheels_for_the_targets_python_and_tags(tmp_path):
    lock = read_lock(REPO / "conda-lock.yml")
    gen = tmp_path / "gen"
    (gen / "lib" / "python3.11").mkdir(parents=True)
    assert wheel_install.env_python_version(gen, lock, FOREIGN) == "3.11"  # the lock's python 3.11.9
    tags = wheel_install.target_platforms(lock, FOREIGN)
    assert tags[0] == f"manylinux_2_35_{ARCH}"  # the glibc the lock recorded for the platform's nodes
    assert {f"manylinux_2_28_{ARCH}", f"manylinux2014_{ARCH}"} <= set(tags)
    assert all(t.endswith(f"_{ARCH}") for t in tags)

    d = sorted(lock.for_platform(FOREIGN, "pip"), key=lambda e: e.name)[0]
    assert requirement_lines([d], mirror=False) == [f"{d.name} @ {d.url} --hash=sha256:{d.sha256}"]
    assert requirement_lines([d], mirror=True) == [f"{d.name}=={d.version} --hash=sha256:{d.sha256}"]

    reqs, dest, wheels = tmp_path / "reqs.txt", tmp_path / "dl", str(tmp_path / "wheels")
    cmd = wheel_install.download_command(reqs, dest, "3.11", tags, None, wheels)
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"]  # this machine's pip, not the env's
    assert {"--isolated", "--no-deps", "--require-hashes"} <= set(cmd)
    flags = dict(zip(cmd, cmd[1:], strict=False))
    assert flags["--only-binary"] == ":all:" and flags["--python-version"] == "3.11"
    assert flags["--implementation"] == "cp" and flags["-r"] == str(reqs) and flags["--dest"] == str(dest)
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--platform"] == tags
    assert cmd[-3:] == ["--no-index", "--find-links", wheels]
    by_index = wheel_install.download_command(reqs, dest, "3.11", tags, "https://mirror/simple", None)
    assert by_index[-2:] == ["--index-url", "https://mirror/simple"] and "--no-index" not in by_index

    (gen / "lib" / "python3.11").rename(gen / "lib" / "python3.12")
    with pytest.raises(ProvisionError, match=r"locks python 3\.11\.9 and .*/lib holds python3\.12"):
        wheel_install.env_python_version(gen, lock, FOREIGN)


@pytest.mark.fast
def test_a_wheel_unpacked_by_the_host_is_laid_out_as_pip_in_the_env_lays_it_out(tmp_path):
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    other = "3.10" if here != "3.10" else "3.12"
    dist = "tinyarm-1.0.dist-info"
    extra = {
        f"{dist}/entry_points.txt": b"[console_scripts]\ntinyarm-hello = tinyarm:main\n",
        "tinyarm-1.0.data/scripts/tinyarm-raw": b"#!python\nprint('raw')\n",
        "tinyarm-1.0.data/headers/tinyarm.h": b"#define TINYARM 1\n",
    }
    wheel = write_wheel(tmp_path / "w", "tinyarm", "1.0", "def main():\n    print('hello')\n",
                        tag=f"cp311-cp311-manylinux_2_28_{ARCH}", extra=extra)  # fmt: skip
    for version, compiled in ((here, True), (other, False)):  # pyc files only for this very python
        gen = tmp_path / f"gen-{version}"
        (gen / "bin").mkdir(parents=True)
        wheel_install.install_wheel(wheel, gen, version, {}, "tinyarm")
        site = gen / "lib" / f"python{version}" / "site-packages"
        assert (site / "tinyarm.py").read_text() == "def main():\n    print('hello')\n"
        script = (gen / "bin" / "tinyarm-hello").read_text().splitlines()
        assert script[0] == f"#!{gen}/bin/python"  # what pip running in the env writes
        assert "from tinyarm import main" in script and os.access(gen / "bin" / "tinyarm-hello", os.X_OK)
        assert (gen / "bin" / "tinyarm-raw").read_text().splitlines()[0] == f"#!{gen}/bin/python"
        assert (gen / "include" / f"python{version}" / "tinyarm" / "tinyarm.h").is_file()
        assert (site / dist / "INSTALLER").read_text() == "lingbot-provision\n"
        assert (site / dist / "REQUESTED").is_file()
        assert any((site / "__pycache__").glob("tinyarm.cpython-*.pyc")) is compiled
        (found,) = importlib.metadata.distributions(path=[str(site)])  # what pip list / uninstall read
        assert found.metadata["Name"] == "tinyarm"
        files = {str(f) for f in found.files or []}
        assert {"tinyarm.py", "../../../bin/tinyarm-hello", f"{dist}/INSTALLER", f"{dist}/RECORD"} <= files
        assert all(Path(str(found.locate_file(f))).exists() for f in found.files or [])


@pytest.mark.fast
def test_an_env_of_another_platform_is_never_provisioned_over(tmp_path):
    target = tmp_path / "envs" / "lingbot-b200"
    manifest_path(target).parent.mkdir(parents=True)
    manifest_path(target).write_text(json.dumps({"platform": current_platform()}))
    spec = load_spec(REPO / "environment.yml")
    with pytest.raises(ProvisionError, match=f"holds the {current_platform()} env.*needs its own place"):
        plan(spec, None, REPO / "conda-lock.yml", target, FOREIGN, install_project=False, log=lambda _: None)


@pytest.mark.fast
@pytest.mark.parametrize("installer", ["conda", "mamba", "micromamba"])
def test_an_installer_that_runs_the_envs_python_is_refused_for_another_platform(tmp_path, installer):
    from provision.install import provision

    spec = load_spec(REPO / "environment.yml")
    the_plan = plan(spec, None, REPO / "conda-lock.yml", tmp_path / "env", FOREIGN, log=lambda _: None)
    with pytest.raises(ProvisionError, match=f"--installer {installer} for {FOREIGN}.*--installer rattler"):
        provision(the_plan, installer=installer, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "env").exists() and not (tmp_path / "cache").exists()
