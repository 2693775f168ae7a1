"""bin/envcheck --worker of an aarch64 env in the emulated, compiler-less aarch64 worker
(`bin/envcheck --simulate-worker --platform linux-aarch64`): the env is provisioned by bin/provision's code
for linux-aarch64 on this x86 host (tests/support/aarch64_env.py: Debian arm64 stand-ins for conda-forge's
python/compilers/sysroot/openssl, the lock's aarch64 torch 2.13.0 and triton 3.7.1 wheels installed by the
host's pip and pypa's installer, no aarch64 program run); the compile rows (Triton's C build, Inductor's
C++ kernel with its precompiled header, cpp_extension) must PASS with the env's toolchain, FlexAttention
on this CPU is SKIPped with the reason (torch's CPU lowering needs AVX2), and each missing piece
(compiler, sysroot files, openssl) must FAIL with its fix.

Opt-in (LINGBOT_AARCH64_WORKER=1, root): it downloads ~2.9 GB of wheels once and runs torch under qemu for
tens of minutes (docs/tests.md has the figures)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from provision import emulation
from tests.support.aarch64_env import download_wheels, provision_env

REPO = Path(__file__).resolve().parents[1]
TARGET = "aarch64-conda-linux-gnu"
COMPILE_ROWS = (
    "compile.triton_build",
    "compile.inductor_cpp",
    "compile.cpp_extension",
)

pytestmark = [
    pytest.mark.heavy,
    pytest.mark.skipif(
        os.environ.get("LINGBOT_AARCH64_WORKER") != "1",
        reason="opt-in lane: LINGBOT_AARCH64_WORKER=1 (root; 2.9 GB of aarch64 wheels, minutes under qemu)",
    ),
]


@pytest.fixture(scope="module")
def aarch64_env() -> Path:
    if os.geteuid() != 0:
        pytest.fail("the emulated aarch64 worker needs root (binfmt_misc, mounts, chroot); run as root")
    cache = Path(os.environ.get("LINGBOT_FIXTURES_CACHE") or Path.home() / ".cache" / "lingbot-fixtures")
    # the emulated worker's qemu and arm64 root (bin/envcheck --simulate-worker reuses this cache); the
    # provision itself runs no aarch64 program
    emulation.qemu_root(cache / "emulation")
    emulation.arm64_root(cache / "emulation")
    wheels = download_wheels(cache / "aarch64-wheels", REPO / "conda-lock.yml")
    prefix, _ = provision_env(cache / "aarch64-work", wheels)
    return prefix


def envcheck(prefix: Path, out: Path, *flags: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run(
        [str(REPO / "bin" / "envcheck"), "--simulate-worker", "--platform", "linux-aarch64",
         "--prefix", str(prefix), "--json-file", str(out), *flags],
        capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    report = json.loads(out.read_text())
    return proc, {c["name"]: c for c in report["checks"]}


class hidden:
    """Rename `paths` aside for the block and back afterwards (exactly those, whatever happens)."""

    def __init__(self, *paths: Path):
        self.paths = paths

    def __enter__(self) -> None:
        self.done: list[Path] = []
        try:
            for path in self.paths:
                path.rename(f"{path}.lingbot-hidden")
                self.done.append(path)
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        for path in reversed(self.done):
            Path(f"{path}.lingbot-hidden").rename(path)
        self.done = []


def _inside(path: str, prefix: Path) -> bool:
    return os.path.realpath(path).startswith(os.path.realpath(prefix) + os.sep)


def test_aarch64_worker_passes_the_compile_rows_with_the_envs_own_toolchain(aarch64_env, tmp_path):
    proc, checks = envcheck(aarch64_env, tmp_path / "pass.json")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for name in (*COMPILE_ROWS, "variables.CC", "variables.CXX", "toolchain.sysroot", "toolchain.openssl"):
        assert checks[name]["status"] == "PASS", checks[name]
    for name in COMPILE_ROWS:
        assert _inside(checks[name]["details"]["compiler_path"], aarch64_env), checks[name]["details"]
        assert f"/bin/{TARGET}-" in checks[name]["details"]["compiler_path"], checks[name]["details"]
    assert _inside(checks["toolchain.openssl"]["details"]["openssl"], aarch64_env)
    assert checks["env.versions"]["status"] == "PASS", checks["env.versions"]  # torch, triton as locked
    flex = checks["compile.flex_attention"]  # torch's CPU FlexAttention lowering is x86-only (AVX2)
    assert flex["status"] == "SKIP" and "AVX2" in flex["message"], flex


@pytest.mark.parametrize(
    "missing, hide, row, fix",
    [
        ("compiler", [f"bin/{TARGET}-{c}" for c in ("cc", "gcc", "c++", "g++")], "variables.CC",
         "gcc_linux-aarch64"),
        ("sysroot", ["sysroot_linux-aarch64"], "toolchain.sysroot", "sysroot_linux-aarch64"),
        ("openssl", ["bin/openssl"], "toolchain.openssl", "openssl"),
    ],
)  # fmt: skip
def test_aarch64_worker_fails_a_missing_piece_with_its_fix(aarch64_env, tmp_path, missing, hide, row, fix):
    if missing == "sysroot":  # every file of the package: glibc's dev files, kernel headers
        (record,) = (aarch64_env / "conda-meta").glob(f"{hide[0]}-*.json")
        hide = json.loads(record.read_text())["files"]
    with hidden(*(aarch64_env / rel for rel in hide)):
        proc, checks = envcheck(aarch64_env, tmp_path / f"no-{missing}.json", "--fast")
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert checks[row]["status"] == "FAIL" and fix in checks[row]["fix"], checks[row]
    if missing == "sysroot":  # the compile rows fail too, with the sysroot's fix
        triton = checks["compile.triton_build"]
        assert triton["status"] == "FAIL" and "sysroot_linux-aarch64" in triton["fix"], triton
    if missing == "openssl":  # Inductor's precompiled header runs it: the C++ row fails, naming the package
        inductor = checks["compile.inductor_cpp"]
        assert inductor["status"] == "FAIL" and "openssl" in inductor["fix"], inductor
    if missing == "compiler":  # the compile rows name the missing program, not a system compiler
        triton = checks["compile.triton_build"]
        assert triton["status"] == "FAIL" and "does not exist" in triton["message"], triton
