"""bin/envcheck on an env of another platform (linux-aarch64: Grace nodes): its fixes name that
platform's compiler and sysroot packages, and its sysroot's glibc is found."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from provision import nodeinfo
from provision.check.checks_node import check_glibc
from provision.check.context import Context
from provision.check.report import FAIL
from provision.prefix import manifest_path


def _prefix(tmp_path: Path, platform: str) -> Path:
    prefix = tmp_path / "env"
    (prefix / "conda-meta").mkdir(parents=True)
    manifest_path(prefix).write_text(json.dumps({"platform": platform}))
    return prefix


@pytest.mark.fast
def test_fixes_name_the_envs_own_platform_packages(tmp_path):
    ctx = Context(
        prefix=_prefix(tmp_path, "linux-aarch64"), worker=True, fast=True, caller_env=dict(os.environ)
    )
    assert ctx.compiler_package("CC") == "gcc_linux-aarch64"
    assert ctx.compiler_package("CXX") == "gxx_linux-aarch64"
    assert "the env lacks gcc_linux-aarch64" in ctx.package_fix(ctx.compiler_package("CC"))
    outcome = check_glibc(ctx)
    assert outcome.status == FAIL
    assert "no sysroot_linux-aarch64" in outcome.message and "sysroot_linux-aarch64" in outcome.fix
    assert "linux-64" not in outcome.message + outcome.fix


@pytest.mark.fast
def test_sysroot_glibc_of_an_aarch64_env(tmp_path):
    prefix = _prefix(tmp_path, "linux-aarch64")
    record = {"name": "sysroot_linux-aarch64", "version": "2.17", "build": "h5b4a56d_16"}
    (prefix / "conda-meta" / "sysroot_linux-aarch64-2.17-h5b4a56d_16.json").write_text(json.dumps(record))
    assert nodeinfo.sysroot_glibc(prefix) == "2.17"


@pytest.mark.fast
def test_simulated_aarch64_worker_refuses_an_env_that_is_not_aarch64(tmp_path):
    import subprocess
    import sys

    from provision.lock import current_platform

    if current_platform() != "linux-64":
        pytest.skip(f"emulating aarch64 is for x86 hosts (this is {current_platform()})")
    prefix = tmp_path / "x86-env"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python").symlink_to(sys.executable)  # an x86-64 program
    proc = subprocess.run(
        [sys.executable, "-m", "provision.check", "--simulate-worker", "--platform", "linux-aarch64",
         "--prefix", str(prefix)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "is not an aarch64 program (ELF machine 3e00)" in proc.stderr
    assert f"bin/provision lingbot-b200 --platform linux-aarch64 --prefix {prefix}" in proc.stderr


@pytest.mark.fast
@pytest.mark.parametrize(
    "interpreter, cpu_only, skipped",
    [
        ({"machine": "aarch64", "cuda_available": False}, True, True),  # Grace CPU: the lowering needs AVX2
        ({"machine": "aarch64", "cuda_available": True}, False, False),  # Grace with its GPU: through Triton
        ({"machine": "x86_64", "cuda_available": False}, True, False),
        # the env's python told nothing (e.g. it timed out): an aarch64 env runs only on aarch64
        (None, True, True),
        (None, False, False),  # ... but a GPU node's python may reach Triton: the probe runs and says
    ],
)
def test_flex_attention_on_a_non_x86_cpu_is_skipped_with_the_reason(
    tmp_path, monkeypatch, interpreter, cpu_only, skipped
):
    from provision.check.checks_compile import check_flex, flex_cpu_unsupported

    monkeypatch.setattr(nodeinfo, "cpu_only_node", lambda: cpu_only)
    ctx = Context(prefix=_prefix(tmp_path, "linux-aarch64"), worker=True, fast=False, caller_env={})
    ctx.__dict__["interpreter"] = interpreter  # the interpreter probe's facts (a cached_property)
    reason = flex_cpu_unsupported(ctx)
    assert bool(reason) is skipped
    if skipped:
        outcome = check_flex(ctx)
        assert outcome.status == "SKIP" and "AVX2" in outcome.message and "aarch64" in outcome.message
        known = "the env is for linux-aarch64" if interpreter is None else "the env's python runs"
        assert known in outcome.message


@pytest.mark.fast
def test_probe_limits_scale_in_the_emulated_worker_and_a_slow_interpreter_says_so(tmp_path, monkeypatch):
    """Under qemu-user (QEMU_CPU, set by --simulate-worker --platform linux-aarch64) every probe gets
    EMULATED_TIMEOUT_SCALE times its limit; an env python that outlives its limit is a FAIL that says it
    timed out (not "failed to start") and names its limit."""
    from provision import probes
    from provision.check import context
    from provision.check.checks_env import check_versions

    prefix = _prefix(tmp_path, "linux-aarch64")
    (prefix / "bin").mkdir()
    hang = tmp_path / "hang"
    os.mkfifo(hang)  # opened for reading, never written: the python blocks until its limit kills it
    (prefix / "bin" / "python").write_text(f"#!/bin/sh\nexec cat {hang}\n")
    (prefix / "bin" / "python").chmod(0o755)
    asked: list[float] = []
    real = probes.run_probe

    def spy(*args, timeout, **kwargs):
        asked.append(timeout)
        return real(*args, timeout=0.5, **kwargs)

    monkeypatch.setattr(probes, "run_probe", spy)
    monkeypatch.setattr(context, "INTERPRETER_TIMEOUT_S", 2)
    native = Context(prefix=prefix, worker=True, fast=False, caller_env={"PATH": "/usr/bin:/bin"})
    emulated = Context(prefix=prefix, worker=True, fast=False, caller_env={"QEMU_CPU": "neoverse-v2"})
    assert (native.timeout_scale, emulated.timeout_scale) == (1, context.EMULATED_TIMEOUT_SCALE)
    native.__dict__["locked_versions"] = emulated.__dict__["locked_versions"] = lambda: {
        ("pip", "torch"): "2.13.0"
    }
    for ctx in (native, emulated):
        outcome = check_versions(ctx)
        assert outcome.status == FAIL and "did not finish importing torch" in outcome.message, outcome
        assert "failed to start" not in outcome.message
    assert "under emulation" in check_versions(emulated).message
    assert asked == [2, 2 * context.EMULATED_TIMEOUT_SCALE]
    native.probe("interpreter", {}, timeout=7)
    emulated.probe("interpreter", {}, timeout=7)
    assert asked[-2:] == [7, 7 * context.EMULATED_TIMEOUT_SCALE]


@pytest.mark.fast
def test_a_local_version_label_matches_the_locked_public_version():
    from provision.check.checks_env import _same_version

    assert _same_version("2.13.0+cu130", "2.13.0")  # torch's aarch64 PyPI wheel, locked as 2.13.0
    assert _same_version("2.13.0", "2.13.0") and _same_version("3.11.2", "3.11.2")
    assert not _same_version("2.13.1+cu130", "2.13.0")
    assert not _same_version("2.13.0+cu126", "2.13.0+cu130")  # a locked local label must be the same
    assert not _same_version("2.12.0", "2.13.0")
