"""bin/envcheck --worker of an aarch64 env in the emulated, compiler-less aarch64 worker
(`bin/envcheck --simulate-worker --platform linux-aarch64`): the env is provisioned by bin/provision's code
for linux-aarch64 on this x86 host (tests/support/aarch64_env.py: Debian arm64 stand-ins for conda-forge's
python/compilers/sysroot/openssl, the lock's aarch64 torch 2.13.0 and triton 3.7.1 wheels installed by the
host's pip and pypa's installer, no aarch64 program run); the compile rows (Triton's C build, Inductor's
C++ kernel with its precompiled header, cpp_extension) must PASS with the env's toolchain, FlexAttention
on this CPU is SKIPped with the reason (torch's CPU lowering needs AVX2), and each missing piece
(compiler, sysroot files, openssl) must FAIL with its fix. A missing piece is hidden by an overlay over
the env in a private mount namespace (tests/support/hidden.py), never by changing the cached env, so the
missing-piece runs go beside the full run (the fixture `reports`).

Opt-in (LINGBOT_AARCH64_WORKER=1, root): it downloads ~2.9 GB of wheels once and runs torch under qemu for
tens of minutes (docs/tests.md has the figures)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from provision import emulation
from tests.support.aarch64_env import fetch, fixtures_cache, provision_env
from tests.support.hidden import package_files, without

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


@dataclass(frozen=True)
class Lane:
    prefix: Path  # the aarch64 env (a symlink to its generation, as bin/provision makes it)
    qemu: Path


@pytest.fixture(scope="module")
def aarch64_env() -> Lane:
    if os.geteuid() != 0:
        pytest.fail("the emulated aarch64 worker needs root (binfmt_misc, mounts, chroot); run as root")
    cache = fixtures_cache()
    # the emulated worker's qemu and arm64 root (bin/envcheck --simulate-worker reuses this cache), the
    # stand-ins' debs and the wheels (.ci/run fetched them beside the suite); the provision itself runs no
    # aarch64 program
    qemu, wheels = fetch(cache)
    prefix, _ = provision_env(cache / "aarch64-work", wheels)
    return Lane(prefix, qemu)


def envcheck_argv(prefix: Path, out: Path, *flags: str) -> list[str]:
    return [str(REPO / "bin" / "envcheck"), "--simulate-worker", "--platform", "linux-aarch64",
            "--prefix", str(prefix), "--json-file", str(out), *flags]  # fmt: skip


MISSING = {  # the piece, the files hidden (relative to the prefix; the sysroot's from its conda-meta record)
    "compiler": [f"bin/{TARGET}-{c}" for c in ("cc", "gcc", "c++", "g++")],
    "sysroot": ["conda-meta:sysroot_linux-aarch64"],
    "openssl": ["bin/openssl"],
}
# The rows each missing-piece run asserts (`--only`: they and the rows they need, e.g. variables.CC/CXX for
# the sysroot): the compile row the piece breaks, where it runs without torch. Inductor's row under qemu
# imports torch and compiles up to the precompiled header (145 s at nice 10 beside the full run, the lane's
# longest missing-piece run): that the C++ row fails naming openssl is held on x86 in the worker simulation
# (tests/test_envcheck.py, ..._openssl_fails_inductors_row_naming_it: the same verdict code), and here the
# openssl row alone says the aarch64 env lacks it.
ROWS = {
    "compiler": "variables.CC,compile.triton_build",
    "sysroot": "toolchain.sysroot,compile.triton_build",
    "openssl": "toolchain.openssl",
}


@pytest.fixture(scope="module")
def reports(aarch64_env, tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, dict]]:
    """The full `--worker` run, and beside it the three runs with a piece missing (`--only` the rows they
    assert), one after another: two emulated envchecks at once (the full run's single-threaded
    cpp_extension compile leaves a core to spare; two bound the memory of qemu'd torch imports), the
    missing-piece runs at nice 10: the full run's longest chain (cpp_extension: torch's import, then
    cc1plus over torch/extension.h, ~150 CPU-s under qemu) is the lane's wall, and it no longer shares its
    core with them (300 s -> see docs/tests.md). The
    binfmt_misc entry is held for all of them: an envcheck finding someone else's entry uses it and leaves
    it, so the first to end cannot take it from the others (test_emulation_aarch64.py holds that
    binfmt_misc is restored exactly)."""
    tmp = tmp_path_factory.mktemp("envchecks")
    out: dict[str, tuple[subprocess.CompletedProcess, dict]] = {}

    def finish(name: str, proc: subprocess.Popen) -> None:
        stdout, stderr = proc.communicate(timeout=3600)
        if not (tmp / f"{name}.json").is_file():  # e.g. a piece to hide was not there: the overlay refused
            pytest.fail(f"envcheck ({name}) wrote no report, exit {proc.returncode}: {stderr[-3000:]}")
        report = json.loads((tmp / f"{name}.json").read_text())
        done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
        out[name] = done, {c["name"]: c for c in report["checks"]}

    def start(argv: list[str]) -> subprocess.Popen:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    prefix = aarch64_env.prefix
    with emulation.binfmt(aarch64_env.qemu):
        full = start(envcheck_argv(prefix, tmp / "full.json"))
        try:
            for name, hide in MISSING.items():
                argv = envcheck_argv(prefix, tmp / f"{name}.json", "--only", ROWS[name])
                hidden = without(prefix, package_files(prefix, hide), argv, tmp / f"overlay-{name}")
                finish(name, start(["nice", "-n", "10", *hidden]))
            finish("full", full)
        finally:
            if full.poll() is None:
                full.kill()
                full.wait()
    return out


def _inside(path: str, prefix: Path) -> bool:
    return os.path.realpath(path).startswith(os.path.realpath(prefix) + os.sep)


def test_aarch64_worker_passes_the_compile_rows_with_the_envs_own_toolchain(aarch64_env, reports):
    prefix = aarch64_env.prefix
    proc, checks = reports["full"]
    failed = "\n".join(f"{c['name']} {c['status']}: {c['message']}\n  fix: {c.get('fix')}" for c in
                       checks.values() if c["status"] == "FAIL")  # fmt: skip
    assert proc.returncode == 0, failed + "\n" + proc.stdout[-3000:] + proc.stderr[-1500:]
    for name in (*COMPILE_ROWS, "variables.CC", "variables.CXX", "toolchain.sysroot", "toolchain.openssl"):
        assert checks[name]["status"] == "PASS", checks[name]
    for name in COMPILE_ROWS:
        assert _inside(checks[name]["details"]["compiler_path"], prefix), checks[name]["details"]
        assert f"/bin/{TARGET}-" in checks[name]["details"]["compiler_path"], checks[name]["details"]
    assert _inside(checks["toolchain.openssl"]["details"]["openssl"], prefix)
    assert checks["env.versions"]["status"] == "PASS", checks["env.versions"]  # torch, triton as locked
    flex = checks["compile.flex_attention"]  # torch's CPU FlexAttention lowering is x86-only (AVX2)
    assert flex["status"] == "SKIP" and "AVX2" in flex["message"], flex


@pytest.mark.parametrize(
    "missing, row, fix",
    [
        ("compiler", "variables.CC", "gcc_linux-aarch64"),
        ("sysroot", "toolchain.sysroot", "sysroot_linux-aarch64"),
        ("openssl", "toolchain.openssl", "openssl"),
    ],
)
def test_aarch64_worker_fails_a_missing_piece_with_its_fix(reports, missing, row, fix):
    proc, checks = reports[missing]
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert checks[row]["status"] == "FAIL" and fix in checks[row]["fix"], checks[row]
    if missing == "sysroot":  # the compile rows fail too, with the sysroot's fix
        triton = checks["compile.triton_build"]
        assert triton["status"] == "FAIL" and "sysroot_linux-aarch64" in triton["fix"], triton
    if missing == "compiler":  # the compile rows name the missing program, not a system compiler
        triton = checks["compile.triton_build"]
        assert triton["status"] == "FAIL" and "does not exist" in triton["message"], triton
