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
    "interpreter, skipped",
    [
        ({"machine": "aarch64", "cuda_available": False}, True),  # Grace CPU: torch's CPU lowering needs AVX2
        ({"machine": "aarch64", "cuda_available": True}, False),  # Grace with its GPU: through Triton
        ({"machine": "x86_64", "cuda_available": False}, False),
        (None, False),  # no facts: the probe runs and says what it finds
    ],
)
def test_flex_attention_on_a_non_x86_cpu_is_skipped_with_the_reason(tmp_path, interpreter, skipped):
    from provision.check.checks_compile import check_flex, flex_cpu_unsupported

    ctx = Context(prefix=_prefix(tmp_path, "linux-aarch64"), worker=True, fast=False, caller_env={})
    ctx.__dict__["interpreter"] = interpreter  # the interpreter probe's facts (a cached_property)
    reason = flex_cpu_unsupported(ctx)
    assert bool(reason) is skipped
    if skipped:
        outcome = check_flex(ctx)
        assert outcome.status == "SKIP" and "AVX2" in outcome.message and "aarch64" in outcome.message


@pytest.mark.fast
def test_a_local_version_label_matches_the_locked_public_version():
    from provision.check.checks_env import _same_version

    assert _same_version("2.13.0+cu130", "2.13.0")  # torch's aarch64 PyPI wheel, locked as 2.13.0
    assert _same_version("2.13.0", "2.13.0") and _same_version("3.11.2", "3.11.2")
    assert not _same_version("2.13.1+cu130", "2.13.0")
    assert not _same_version("2.13.0+cu126", "2.13.0+cu130")  # a locked local label must be the same
    assert not _same_version("2.12.0", "2.13.0")
