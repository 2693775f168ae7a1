"""Provisioning for another architecture (an aarch64 env for Grace nodes, built on an x86 login node
onto a shared filesystem): what it needs, and a clear refusal where this machine cannot do it.

Contract: `foreign(platform)` says whether `platform` is not this machine's; `runner(platform)` returns
the binfmt_misc entry that lets this kernel execute `platform`'s ELF programs (qemu-user with the F
flag) or None; `loader_root(platform)` where qemu finds the target's glibc loader (QEMU_LD_PREFIX or /),
which the env's dynamically linked python needs, or None; `cross_install_refusal(platform,
needs_target_binaries)` returns "" when the install can go ahead, else one message naming what needs
the target's binaries and the fixes.

What runs target binaries: linking the conda packages does not (py-rattler copies files, rewrites
prefixes; link scripts are not run) and neither does capturing the compilers' activate.d variables
(host bash sourcing shell scripts). The pip part and this checkout's project step run the env's own
python (`bin/python -m pip`), which is the target's: those need emulation. `--no-project` with a lock
without a pip part needs none.
"""

from __future__ import annotations

import os
from pathlib import Path

BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
# ELF e_machine of each platform (little-endian, bytes 18-19 of the header), as binfmt magic hex
ELF_MACHINE = {"linux-64": "3e00", "linux-aarch64": "b700", "linux-ppc64le": "1500"}
# each platform's ELF interpreter: the env's python (conda-forge's too) is linked against the node's glibc
LOADER = {"linux-64": "lib64/ld-linux-x86-64.so.2", "linux-aarch64": "lib/ld-linux-aarch64.so.1",
          "linux-ppc64le": "lib64/ld64.so.2"}  # fmt: skip
_QEMU = {"linux-64": "x86_64", "linux-aarch64": "aarch64", "linux-ppc64le": "ppc64le"}


def foreign(platform: str) -> bool:
    from provision.lock import current_platform

    return platform != current_platform()


def runner(platform: str, binfmt_dir: Path | None = None) -> str | None:
    """The enabled binfmt_misc entry (its interpreter) that runs `platform`'s 64-bit ELF programs."""
    machine = ELF_MACHINE.get(platform)
    directory = binfmt_dir or BINFMT_DIR
    if machine is None or not directory.is_dir():
        return None
    for entry in sorted(directory.iterdir()):
        if entry.name in ("register", "status"):
            continue
        try:
            fields = {
                line.partition(" ")[0]: line.partition(" ")[2] for line in entry.read_text().splitlines()
            }
        except OSError:
            continue
        magic = fields.get("magic", "")
        if "enabled" in fields and magic.startswith("7f454c4602") and magic[36:40] == machine:
            return fields.get("interpreter", entry.name)
    return None


def loader_root(platform: str) -> str | None:
    """Where qemu finds `platform`'s dynamic loader: QEMU_LD_PREFIX (default /) if it has one, else None."""
    root = os.environ.get("QEMU_LD_PREFIX") or "/"
    return root if platform not in LOADER or Path(root, LOADER[platform]).exists() else None


def cross_install_refusal(
    platform: str, needs_target_binaries: list[str], binfmt_dir: Path | None = None
) -> str:
    """ "" when an install for `platform` can run here, else why not and the fixes (one message)."""
    if not foreign(platform) or not needs_target_binaries:
        return ""
    from provision.lock import current_platform

    qemu = _QEMU.get(platform, platform)
    if runner(platform, binfmt_dir) is not None:
        if loader_root(platform) is not None:
            return ""
        root = os.environ.get("QEMU_LD_PREFIX") or "/"
        return (
            f"the env is for {platform}: {' and '.join(needs_target_binaries)} run the env's own python, "
            f"which qemu can start only with {platform}'s glibc loader, and {Path(root, LOADER[platform])} "
            f"does not exist; fix: install it (Debian: apt-get install libc6-{qemu.replace('_', '-')}-cross) "
            f"and export QEMU_LD_PREFIX=/usr/{qemu}-linux-gnu, or run bin/provision on a {platform} node"
        )
    return (
        f"the env is for {platform} and this machine is {current_platform()}: "
        f"{' and '.join(needs_target_binaries)} run the env's own python, a {platform} program this "
        f"kernel cannot execute (no enabled binfmt_misc entry for it under {binfmt_dir or BINFMT_DIR}); "
        f"fixes: run bin/provision on a {platform} node (it needs no emulation there), or register "
        f"qemu-user-static's {qemu} interpreter with the F flag (apt-get install qemu-user-static "
        f"binfmt-support), or `bin/provision NAME --platform {platform} --export DIR` here and "
        f"`bin/provision NAME --from DIR` on a {platform} node"
    )
