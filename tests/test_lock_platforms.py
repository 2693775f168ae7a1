"""One lock for linux-64 and linux-aarch64 (Grace nodes): conda-lock's platform selectors in
environment.yml, each platform's own wheels, markers and virtual packages in conda-lock.yml."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provision.lock import check_lock, read_lock
from provision.spec import SpecError, load_spec
from tests.support.channel import index_channel, make_package
from tests.support.wheels import write_simple_index, write_wheel

REPO = Path(__file__).resolve().parents[1]

SELECTOR_SPEC = """\
name: grace-env
channels:
  - conda-forge
platforms:
  - linux-64
  - linux-aarch64
dependencies:
  - python 3.11.*
  - gcc_linux-64 13.*  # [linux64]
  - gcc_linux-aarch64 12.*  # [aarch64]
  - openssl 3.*  # [linux]
  - pip
  - pip:
      - numpy>=1.26
      - onlyx86  # [linux64]
"""


def run_cli(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONDA_ENVS_PATH": str(tmp / "envs"), "LINGBOT_PKGS_DIR": str(tmp / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "provision.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.fast
def test_selectors_select_the_lines_conda_lock_selects(tmp_path):
    from conda_lock.src_parser.environment_yaml import parse_environment_file

    path = tmp_path / "environment.yml"
    path.write_text(SELECTOR_SPEC)
    spec = load_spec(path)
    mapping = tmp_path / "mapping.json"
    mapping.write_text("{}")
    theirs = parse_environment_file(path, spec.platforms, mapping_url=str(mapping))
    for platform in ("linux-64", "linux-aarch64"):
        mine = spec.for_platform(platform)
        their_deps = theirs.dependencies[platform]
        assert {d.name for d in their_deps if d.manager == "conda"} == {s.split()[0] for s in mine.conda}
        assert {d.name for d in their_deps if d.manager == "pip"} == {r.split(">")[0] for r in mine.pip}
    assert "gcc_linux-aarch64 12.*" in spec.for_platform("linux-aarch64").conda
    assert "gcc_linux-64 13.*" not in spec.for_platform("linux-aarch64").conda
    assert "onlyx86" not in spec.for_platform("linux-aarch64").pip


@pytest.mark.fast
def test_selector_conda_lock_would_not_apply_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "environment.yml"
    path.write_text(SELECTOR_SPEC.replace("# [aarch64]", "# [not linux64]"))
    with pytest.raises(SpecError, match=r"environment.yml:10: selector \[not linux64\]"):
        load_spec(path)


@pytest.mark.fast
def test_content_hash_of_each_platform_is_conda_locks_own(tmp_path):
    """The drift rule per platform: conda-lock's hash of its own parse of the file with selectors."""
    from conda_lock.content_hash import compute_content_hashes
    from conda_lock.src_parser import make_lock_spec
    from conda_lock.virtual_package import virtual_package_repo_from_specification

    from provision.drift import content_hash
    from provision.vpkgs import VirtualPackages, write_spec_file

    path = tmp_path / "environment.yml"
    path.write_text(SELECTOR_SPEC)
    spec = load_spec(path)
    vps = {"linux-64": VirtualPackages(), "linux-aarch64": VirtualPackages(archspec="aarch64", cuda="")}
    write_spec_file(tmp_path / "vp.yml", vps)
    mapping = tmp_path / "mapping.json"
    mapping.write_text("{}")
    lock_spec = make_lock_spec(src_files=[path], platform_overrides=spec.platforms, mapping_url=str(mapping))
    theirs = compute_content_hashes(lock_spec, virtual_package_repo_from_specification(tmp_path / "vp.yml"))
    for platform, vp in vps.items():
        assert content_hash(spec, platform, vp) == theirs[platform]


def _grace_channel(tmp: Path) -> Path:
    channel = tmp / "channel"
    for subdir in ("linux-64", "linux-aarch64"):
        make_package(channel / subdir, "python", "3.11.9", {"share/py.txt": subdir.encode()}, subdir=subdir)
    make_package(channel / "noarch", "pip", "24.2", {"share/pip.txt": b"pip\n"}, noarch="generic")
    index_channel(channel)
    return channel


def _grace_index(tmp: Path) -> str:
    """`gamma` as one wheel per architecture; it needs `armonly` on aarch64 and `x86only` on x86_64."""
    wheels = []
    for arch in ("x86_64", "aarch64"):
        wheels.append(
            write_wheel(
                tmp / "wheels",
                "gamma",
                "1.0",
                f"ARCH = {arch!r}\n",
                requires=['armonly; platform_machine == "aarch64"', 'x86only; platform_machine == "x86_64"'],
                tag=f"cp311-cp311-manylinux_2_28_{arch}",
            )
        )
    wheels.append(write_wheel(tmp / "wheels", "armonly", "1.0", ""))
    wheels.append(write_wheel(tmp / "wheels", "x86only", "1.0", ""))
    return write_simple_index(tmp / "index", wheels)


@pytest.mark.heavy
def test_two_platform_relock_locks_each_platforms_wheels_markers_and_virtual_packages(tmp_path):
    channel = _grace_channel(tmp_path)
    spec_path = tmp_path / "environment.yml"
    spec_path.write_text(
        f"name: grace-env\nchannels:\n  - {channel}\nplatforms:\n  - linux-64\n  - linux-aarch64\n"
        "dependencies:\n  - python 3.11.*\n  - pip\n  - pip:\n      - gamma\n"
    )
    vp_file = tmp_path / "virtual-packages.yml"
    vp_file.write_text(
        yaml.safe_dump(
            {
                "subdirs": {
                    "linux-64": {
                        "packages": {"__glibc": "2.35", "__linux": "5.15", "__archspec": "1 x86_64"}
                    },
                    "linux-aarch64": {
                        "packages": {"__glibc": "2.34", "__linux": "6.8", "__archspec": "1 aarch64"}
                    },
                }
            }
        )
    )
    result = run_cli(
        "-f", str(spec_path), "--relock", "--pip-index", _grace_index(tmp_path), "-q", tmp=tmp_path
    )
    assert result.returncode == 0, result.stderr
    lock = read_lock(tmp_path / "conda-lock.yml")
    assert lock.platforms == ["linux-64", "linux-aarch64"]
    for platform, arch, only, other in (
        ("linux-64", "x86_64", "x86only", "armonly"),
        ("linux-aarch64", "aarch64", "armonly", "x86only"),
    ):
        pip = {p.name: p for p in lock.for_platform(platform, "pip")}
        assert pip["gamma"].url.endswith(f"manylinux_2_28_{arch}.whl"), (platform, pip["gamma"].url)
        assert only in pip and other not in pip, (platform, sorted(pip))
        check_lock(load_spec(spec_path), lock.path, platform, log=lambda _: None)
    recorded = json.loads(
        yaml.safe_load(lock.path.read_text())["metadata"]["custom_metadata"]["lingbot_virtual_packages"]
    )
    assert recorded["linux-aarch64"]["__archspec"] == "1 aarch64"
    assert recorded["linux-aarch64"]["__glibc"] == "2.34"
    assert recorded["linux-64"]["__archspec"] == "1 x86_64"
    arm = lock.recorded_vpkgs_for("linux-aarch64")
    assert arm is not None and arm.glibc == "2.34"
