"""environment.yml parsing, conda-lock.yml writing and the refusals: drift, platform, name, bad YAML."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provision.install import plan
from provision.lock import LockError, check_lock, content_hash, read_lock
from provision.spec import SpecError, check_env_name, load_spec
from tests.support.channel import index_channel, make_package

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, env_extra: dict | None = None, tmp: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "CONDA_ENVS_PATH": str(tmp / "envs"),
        "LINGBOT_PKGS_DIR": str(tmp / "cache"),
        **(env_extra or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "provision.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def tiny_channel(tmp_path_factory) -> Path:
    channel = tmp_path_factory.mktemp("tiny-channel")
    make_package(channel / "linux-64", "alpha", "1.0", {"share/alpha.txt": b"alpha\n"}, depends=["beta >=2"])
    make_package(channel / "noarch", "beta", "2.1", {"share/beta.txt": b"beta\n"}, noarch="generic")
    index_channel(channel)
    return channel


def write_spec(directory: Path, channel: Path, deps=("alpha",), name="tiny-env", extra="") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    spec = directory / "environment.yml"
    spec.write_text(
        f"name: {name}\nchannels:\n  - {channel}\ndependencies:\n"
        + "".join(f"  - {d}\n" for d in deps)
        + extra
    )
    return spec


# --- the committed lock ---------------------------------------------------------------------------


@pytest.mark.fast
def test_repo_lock_is_a_solve_of_the_spec_with_compilers_and_both_hashes():
    from conda_lock.lockfile import parse_conda_lock_file

    spec = load_spec(REPO / "environment.yml")
    lock_path = REPO / "conda-lock.yml"
    header = check_lock(spec, lock_path, "linux-64")  # the drift check a provision runs
    # the slow path too: conda-lock's content hash recomputed from the spec equals the recorded one,
    # with the recorded virtual packages and with the committed --virtual-package-spec file alike
    assert content_hash(spec, "linux-64", header.recorded_vpkgs) == header.content_hash["linux-64"]
    assert content_hash(spec, "linux-64", REPO / "virtual-packages.yml") == header.content_hash["linux-64"]
    lock = parse_conda_lock_file(lock_path)
    conda = {p.name: p for p in lock.package if p.manager == "conda"}
    for name in ("gcc_linux-64", "gxx_linux-64", "sysroot_linux-64", "python", "pip"):
        assert name in conda, f"{name} missing from {lock_path}"
    for p in conda.values():
        assert len(p.hash.md5 or "") == 32 and len(p.hash.sha256 or "") == 64, p.name
        # the spec's channel, never the mirror it was solved against (a relock with --channel DIR)
        assert p.url.startswith("https://conda.anaconda.org/conda-forge/"), p.url
    assert conda["sysroot_linux-64"].version == "2.17"  # the glibc floor: any glibc >= 2.17 runs it
    pip = {p.name: p for p in lock.package if p.manager == "pip"}
    assert pip["torch"].version == "2.13.0" and all(len(p.hash.sha256) == 64 for p in pip.values())
    assert header.recorded_vpkgs is not None and header.recorded_vpkgs.glibc == "2.35"  # ubuntu 22.04
    # one owner per package: setuptools (torch needs >= 77.0.3, the channel has 75.1.0) is pip's only,
    # with the reason recorded; ninja (torch.utils.cpp_extension's build tool) is locked
    assert not set(conda) & set(pip), set(conda) & set(pip)
    assert (
        "setuptools" in pip
        and "setuptools" in header.dropped
        and "torch needs" in header.dropped["setuptools"]
    )
    assert "ninja" in pip


@pytest.mark.fast
def test_content_hash_leaves_nothing_in_the_temp_folder(tmp_path, monkeypatch):
    """conda-lock's fake repodata folder is removed when the hash is made, not at exit: bin/provision ends
    with os._exit (provision/cli.py), so an atexit removal left one folder in $TMPDIR a run."""
    import tempfile

    spec = load_spec(REPO / "environment.yml")
    header = check_lock(spec, REPO / "conda-lock.yml", "linux-64", log=lambda _: None)
    monkeypatch.delenv("RUNNER_TEMP", raising=False)  # conda-lock's folder goes there when set
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for source in (header.recorded_vpkgs, REPO / "virtual-packages.yml", None):
        assert len(content_hash(spec, "linux-64", source)) == 64
        assert sorted(p.name for p in tmp_path.iterdir()) == [], source


@pytest.mark.fast
def test_repo_lock_holds_each_platforms_own_compilers_wheels_and_virtual_packages():
    """Grace nodes (linux-aarch64) in the same lock: their compilers, sysroot, openssl, aarch64 wheels."""
    spec = load_spec(REPO / "environment.yml")
    lock_path = REPO / "conda-lock.yml"
    for platform, arch, gcc in (("linux-64", "x86_64", "13."), ("linux-aarch64", "aarch64", "12.")):
        header = check_lock(spec, lock_path, platform, log=lambda _: None)
        vp = header.recorded_vpkgs_for(platform)
        assert vp is not None and vp.archspec == arch
        assert content_hash(spec, platform, vp) == header.content_hash[platform]
        assert content_hash(spec, platform, REPO / "virtual-packages.yml") == header.content_hash[platform]
        conda = {p.name: p for p in header.for_platform(platform, "conda")}
        assert conda[f"gcc_{platform}"].version.startswith(gcc) and f"gxx_{platform}" in conda
        assert conda[f"sysroot_{platform}"].version == "2.17" and "openssl" in conda
        other = "linux-aarch64" if platform == "linux-64" else "linux-64"
        assert not any(other in name for name in conda), sorted(conda)
        assert all(p.subdir in (platform, "noarch") for p in conda.values())
        pip = {p.name: p for p in header.for_platform(platform, "pip")}
        assert pip["torch"].version == "2.13.0" and pip["triton"].version == "3.7.1"
        for p in pip.values():  # every binary wheel is this platform's
            assert p.file_name.endswith(("-none-any.whl", f"_{arch}.whl")), (platform, p.file_name)


@pytest.mark.fast
def test_spec_declares_settings_and_the_project(tmp_path):
    spec = load_spec(REPO / "environment.yml")
    assert spec.name == "lingbot-b200"
    assert spec.pip_local == []  # conda-lock parses the spec; the checkout is installed in its own step
    the_plan = plan(spec, None, REPO / "conda-lock.yml", tmp_path / "env", "linux-64", log=lambda _: None)
    assert the_plan.projects == [REPO]
    assert plan(spec, None, REPO / "conda-lock.yml", tmp_path / "env", "linux-64", install_project=False,
                log=lambda _: None).projects == []  # fmt: skip
    # the spec's own variables only: CC/CXX/CPATH come from the linked prefix (tests/test_activation.py)
    assert [e.name for e in spec.variable_entries()] == list(spec.variables)
    assert "TRITON_CACHE_DIR" in spec.variables and "CC" not in spec.variables


# --- refusals -------------------------------------------------------------------------------------


@pytest.mark.heavy
def test_editing_the_spec_makes_provision_refuse_until_relocked(tmp_path):
    shutil.copy(REPO / "environment.yml", tmp_path / "environment.yml")
    shutil.copy(REPO / "conda-lock.yml", tmp_path / "conda-lock.yml")
    spec_path = tmp_path / "environment.yml"
    text = spec_path.read_text()
    # a comment or a variable is not drift (nothing to re-solve) ...
    spec_path.write_text("# a note\n" + text.replace("LINGBOT_GPU_KIND: b200", "LINGBOT_GPU_KIND: b200x"))
    check_lock(load_spec(spec_path), tmp_path / "conda-lock.yml", "linux-64")
    # ... a dependency is
    spec_path.write_text(text.replace("  - pip\n", "  - pip\n  - make\n", 1))
    with pytest.raises(LockError, match="drift"):
        check_lock(load_spec(spec_path), tmp_path / "conda-lock.yml", "linux-64")
    result = run_cli("lingbot-b200", "-f", str(spec_path), tmp=tmp_path)
    assert result.returncode == 2
    assert "drift" in result.stderr and "--relock" in result.stderr and str(spec_path) in result.stderr
    assert not (tmp_path / "envs" / "lingbot-b200").exists()


@pytest.mark.heavy
def test_lock_without_the_platform_is_refused(tmp_path, tiny_channel):
    spec = write_spec(tmp_path, tiny_channel)
    assert run_cli("-f", str(spec), "--relock", "-q", tmp=tmp_path).returncode == 0
    result = run_cli("-f", str(spec), "--platform", "linux-aarch64", tmp=tmp_path)
    assert result.returncode == 2
    assert "no packages for platform linux-aarch64" in result.stderr


@pytest.mark.fast
def test_unknown_env_name_is_refused(tmp_path, tiny_channel):
    spec = write_spec(tmp_path, tiny_channel)
    with pytest.raises(SpecError, match="not declared"):
        check_env_name(load_spec(spec), "other-env")
    result = run_cli("other-env", "-f", str(spec), tmp=tmp_path)
    assert result.returncode == 2 and "'other-env' is not declared in" in result.stderr


@pytest.mark.fast
def test_malformed_yaml_names_file_and_line(tmp_path):
    bad = tmp_path / "environment.yml"
    bad.write_text("name: x\nchannels:\n  - conda-forge\ndependencies:\n  - python\n  - [oops\n")
    with pytest.raises(SpecError, match=rf"{bad}:7:1: malformed YAML"):
        load_spec(bad)
    result = run_cli("-f", str(bad), tmp=tmp_path)
    assert result.returncode == 2 and f"{bad}:7" in result.stderr


@pytest.mark.fast
def test_malformed_lock_is_refused(tmp_path, tiny_channel):
    spec = write_spec(tmp_path, tiny_channel)
    (tmp_path / "conda-lock.yml").write_text("version: 1\nmetadata: {\n")
    with pytest.raises(LockError, match=r"conda-lock.yml:\d+: malformed YAML"):
        read_lock(tmp_path / "conda-lock.yml")
    assert run_cli("-f", str(spec), tmp=tmp_path).returncode == 2


@pytest.mark.fast
@pytest.mark.parametrize(
    "variables, message",
    [
        ("  CC: /usr/bin/gcc\n", "computes from the compiler packages"),
        ("  X: $(rm -rf /)\n", "must be non-empty plain text"),
        ("  X: ${UNDEFINED}/y\n", "neither one of"),
    ],
)
def test_bad_variables_are_refused_naming_the_file(tmp_path, tiny_channel, variables, message):
    spec = write_spec(
        tmp_path, tiny_channel, deps=("alpha", "gcc_linux-64"), extra="variables:\n" + variables
    )
    with pytest.raises(SpecError, match=message) as info:
        load_spec(spec)
    assert str(spec) in str(info.value)


# --- locking --------------------------------------------------------------------------------------


@pytest.mark.heavy
def test_relock_writes_conda_lock_v1_that_both_parsers_read(tmp_path, tiny_channel):
    import rattler
    from conda_lock.lockfile import parse_conda_lock_file

    spec = write_spec(tmp_path, tiny_channel)
    result = run_cli(
        "-f", str(spec), "--relock", "--glibc", "2.28", "--cuda", "", "--json", "-q", tmp=tmp_path
    )
    assert result.returncode == 0, result.stderr
    lock_path = tmp_path / "conda-lock.yml"
    lock = parse_conda_lock_file(lock_path)
    assert sorted(p.name for p in lock.package) == ["alpha", "beta"]
    assert all(p.hash.md5 and p.hash.sha256 for p in lock.package)
    header = read_lock(lock_path)
    assert header.recorded_vpkgs is not None
    assert header.recorded_vpkgs.glibc == "2.28" and header.recorded_vpkgs.cuda == ""
    rattler_lock = rattler.LockFile.from_path(lock_path)
    environment = rattler_lock.default_environment()
    assert environment is not None
    records = environment.conda_repodata_records_for_platform(rattler_lock.platforms()[0]) or []
    assert {r.name.normalized for r in records} == {"alpha", "beta"}
    check_lock(load_spec(spec), lock_path, "linux-64")


@pytest.mark.fast
def test_missing_package_in_channel_is_reported(tmp_path, tiny_channel):
    spec = write_spec(tmp_path, tiny_channel, deps=("alpha", "sysroot_linux-64 2.17.*"))
    result = run_cli("-f", str(spec), "--relock", "-q", tmp=tmp_path)
    assert result.returncode == 2
    assert "cannot solve" in result.stderr and "sysroot_linux-64" in result.stderr
    assert not (tmp_path / "conda-lock.yml").exists()
