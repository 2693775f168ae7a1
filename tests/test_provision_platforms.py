"""bin/provision --platform for another architecture (an aarch64 env for Grace nodes from an x86 login
node): refused up front, with the fixes, where a step would run the target's binaries and this kernel
cannot; allowed where nothing runs them or binfmt_misc runs them; never over another platform's env."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision import crossarch
from provision.install import plan
from provision.lock import current_platform
from provision.plan import ProvisionError
from provision.prefix import manifest_path
from provision.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
FOREIGN = "linux-aarch64" if current_platform() != "linux-aarch64" else "linux-64"
QEMU_AARCH64_MAGIC = "7f454c460201010000000000000000000200b700"


def _binfmt(tmp_path: Path, entries: dict[str, str]) -> Path:
    directory = tmp_path / "binfmt_misc"
    directory.mkdir(parents=True)
    (directory / "register").write_text("")
    (directory / "status").write_text("enabled\n")
    for name, text in entries.items():
        (directory / name).write_text(text)
    return directory


@pytest.mark.fast
def test_runner_is_an_enabled_binfmt_entry_for_the_platforms_elf_machine(tmp_path):
    entry = (
        "{state}\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: OCF\noffset 0\n"
        f"magic {QEMU_AARCH64_MAGIC}\nmask ffffffffffffff00fffffffffffffffffeffffff\n"
    )
    assert crossarch.runner("linux-aarch64", _binfmt(tmp_path, {})) is None
    on = _binfmt(tmp_path / "on", {"qemu-aarch64": entry.format(state="enabled")})
    assert crossarch.runner("linux-aarch64", on) == "/usr/libexec/qemu-binfmt/aarch64-binfmt-P"
    assert crossarch.runner("linux-64", on) is None  # an aarch64 runner runs no x86-64 program
    off = _binfmt(tmp_path / "off", {"qemu-aarch64": entry.format(state="disabled")})
    assert crossarch.runner("linux-aarch64", off) is None


@pytest.mark.fast
def test_foreign_env_with_a_pip_part_is_refused_up_front_without_emulation(tmp_path, monkeypatch):
    monkeypatch.setattr(crossarch, "BINFMT_DIR", _binfmt(tmp_path, {}))
    spec = load_spec(REPO / "environment.yml")
    with pytest.raises(ProvisionError) as info:
        plan(spec, None, REPO / "conda-lock.yml", tmp_path / "env", FOREIGN, log=lambda _: None)
    message = str(info.value)
    assert f"the env is for {FOREIGN} and this machine is {current_platform()}" in message
    assert "the pip part" in message and "binfmt_misc" in message
    assert f"--platform {FOREIGN} --export DIR" in message and "qemu-user-static" in message
    assert not (tmp_path / "env").exists()


@pytest.mark.fast
def test_foreign_env_goes_ahead_where_binfmt_runs_its_programs(tmp_path, monkeypatch):
    machine = crossarch.ELF_MACHINE[FOREIGN]
    magic = QEMU_AARCH64_MAGIC[:36] + machine
    entry = f"enabled\ninterpreter /usr/bin/qemu-x-static\nflags: F\noffset 0\nmagic {magic}\n"
    monkeypatch.setattr(crossarch, "BINFMT_DIR", _binfmt(tmp_path, {"qemu": entry}))
    spec = load_spec(REPO / "environment.yml")
    monkeypatch.setenv("QEMU_LD_PREFIX", str(tmp_path / "no-target-libc"))
    with pytest.raises(ProvisionError) as refused:  # qemu runs it, but the env's python needs the loader
        plan(spec, None, REPO / "conda-lock.yml", tmp_path / "env", FOREIGN, log=lambda _: None)
    loader = tmp_path / "no-target-libc" / crossarch.LOADER[FOREIGN]
    assert str(loader) in str(refused.value) and "QEMU_LD_PREFIX=" in str(refused.value)
    loader.parent.mkdir(parents=True)
    loader.write_bytes(b"")
    the_plan = plan(spec, None, REPO / "conda-lock.yml", tmp_path / "env", FOREIGN, log=lambda _: None)
    assert the_plan.platform == FOREIGN


@pytest.mark.fast
def test_an_env_of_another_platform_is_never_provisioned_over(tmp_path, monkeypatch):
    monkeypatch.setattr(crossarch, "BINFMT_DIR", _binfmt(tmp_path, {}))
    target = tmp_path / "envs" / "lingbot-b200"
    manifest_path(target).parent.mkdir(parents=True)
    manifest_path(target).write_text(json.dumps({"platform": current_platform()}))
    spec = load_spec(REPO / "environment.yml")
    with pytest.raises(ProvisionError, match=f"holds the {current_platform()} env.*needs its own place"):
        plan(spec, None, REPO / "conda-lock.yml", target, FOREIGN, install_project=False, log=lambda _: None)
