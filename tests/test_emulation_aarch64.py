"""The emulated aarch64 worker (provision/emulation.py): a Debian arm64 root without compiler or
openssl, chrooted under qemu through binfmt_misc, with a Grace CPU description; binfmt_misc left
exactly as it was found. Opt-in (LINGBOT_AARCH64_EMULATION=1): it downloads ~80 MB of .debs once and
registers a binfmt_misc entry machine-wide for its duration."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from provision import emulation

pytestmark = [
    pytest.mark.heavy,
    pytest.mark.skipif(
        os.environ.get("LINGBOT_AARCH64_EMULATION") != "1",
        reason="opt-in lane: LINGBOT_AARCH64_EMULATION=1 (root; builds an arm64 root, registers binfmt_misc)",
    ),
]

PROBE = """
import json, os, platform, shutil, sys
midr = open("/sys/devices/system/cpu/cpu0/regs/identification/midr_el1").read().strip()
part = [l for l in open("/proc/cpuinfo") if l.startswith("CPU part")][0].split(":")[1].strip()
json.dump({"machine": platform.machine(), "python": sys.version.split()[0], "midr": midr, "part": part,
           "openssl": shutil.which("openssl"), "gcc": shutil.which("gcc") or shutil.which("cc"),
           "stdio_h": os.path.exists("/usr/include/stdio.h")}, open(sys.argv[1], "w"))
"""


def _binfmt_state() -> tuple[bool, str | None]:
    mounted = (emulation.BINFMT / "register").exists()
    entry = emulation.BINFMT / emulation.ENTRY
    return mounted, entry.read_text() if mounted and entry.exists() else None


def test_emulated_aarch64_worker_is_grace_without_compiler_or_openssl_and_binfmt_is_restored(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("the emulated aarch64 worker needs root (binfmt_misc, mounts, chroot); run as root")
    cache = Path(os.environ.get("LINGBOT_FIXTURES_CACHE") or Path.home() / ".cache" / "lingbot-fixtures")
    qemu, root = emulation.qemu_root(cache / "emulation"), emulation.arm64_root(cache / "emulation")
    before = _binfmt_state()
    out = tmp_path / "facts.json"
    with emulation.binfmt(qemu) as interpreter:
        assert "qemu-aarch64" in interpreter
        argv = ["/usr/bin/env", "-", "PATH=/usr/bin:/bin", "/usr/bin/python3.11", "-c", PROBE, str(out)]
        proc = subprocess.run(
            emulation.chroot_command(root, argv, [tmp_path]), capture_output=True, text=True, timeout=600
        )
    assert _binfmt_state() == before, "binfmt_misc was not restored exactly"
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(out.read_text())
    assert facts["machine"] == "aarch64" and facts["python"].startswith("3.11.")
    assert facts["midr"] == emulation.NEOVERSE_V2_MIDR and facts["part"] == "0xd4f"  # Neoverse V2 (Grace)
    assert facts["openssl"] is None and facts["gcc"] is None and not facts["stdio_h"]
