"""Facts about the node a job runs on: filesystems under a path, glibc, free disk, NVIDIA devices.

Stdlib only (bin/train imports it inside the env for its node-local cache decision). The mount table
is read from /proc/self/mountinfo unless a caller passes another one, so tests control it.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = "/proc/self/mountinfo"

# Filesystem types whose caches are shared between nodes (or go through a userspace daemon): file
# locking and rename semantics differ from a local disk, which is where Triton's and Inductor's cache
# races bite (triton#11512, pytorch#173679).
NETWORK_FS_TYPES = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "smbfs", "ceph", "cephfs", "glusterfs",
    "afs", "ocfs2", "gfs2", "9p", "panfs", "pvfs2", "orangefs", "wekafs", "davfs", "virtiofs",
})  # fmt: skip
# fuse.<daemon> (sshfs, s3fs, gcsfuse, juicefs, ...) is networked or at least not a local disk;
# fuseblk is a local block device (ntfs-3g, exfat) and stays local.
NETWORK_FS_PREFIXES = ("fuse.",)


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str
    source: str


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str, source: str = MOUNTINFO) -> list[Mount]:
    """The mounts of a mountinfo table (proc(5) format), in table order; ValueError names the line."""
    mounts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split(" ")
        try:
            separator = fields.index("-", 6)
            mounts.append(
                Mount(
                    mount_point=_unescape(fields[4]),
                    fstype=fields[separator + 1],
                    source=_unescape(fields[separator + 2]),
                )
            )
        except (ValueError, IndexError):
            raise ValueError(f"{source}:{number}: not a mountinfo line: {line!r}") from None
    return mounts


def read_mounts(mountinfo: str | os.PathLike[str] | None = None) -> list[Mount]:
    path = os.fspath(mountinfo) if mountinfo is not None else MOUNTINFO
    return parse_mountinfo(Path(path).read_text(), path)


def existing_ancestor(path: str | os.PathLike[str]) -> Path:
    """`path` itself if it exists, else its nearest existing parent (a cache dir may not exist yet)."""
    current = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def mount_of(path: str | os.PathLike[str], mountinfo: str | os.PathLike[str] | None = None) -> Mount:
    """The mount `path` lives on: longest mount-point prefix of its real path; the later of two mounts
    on the same point wins (it is stacked on top)."""
    real = os.path.realpath(existing_ancestor(path))
    best: Mount | None = None
    for mount in read_mounts(mountinfo):
        point = mount.mount_point.rstrip("/") or "/"
        inside = point == "/" or real == point or real.startswith(point + "/")
        if inside and (best is None or len(point) >= len(best.mount_point.rstrip("/") or "/")):
            best = mount
    if best is None:
        raise ValueError(f"no mount in {mountinfo or MOUNTINFO} contains {real}")
    return best


def filesystem_type(path: str | os.PathLike[str], mountinfo: str | os.PathLike[str] | None = None) -> str:
    """The filesystem type (as the kernel names it: ext4, tmpfs, nfs4, fuse.sshfs, ...) holding `path`."""
    return mount_of(path, mountinfo).fstype


def is_network_fs(fstype: str) -> bool:
    return fstype in NETWORK_FS_TYPES or fstype.startswith(NETWORK_FS_PREFIXES)


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Free bytes for an unprivileged writer on the filesystem holding `path` (or its nearest parent)."""
    return shutil.disk_usage(existing_ancestor(path)).free


# -- glibc ---------------------------------------------------------------------------------------


def parse_version(text: str) -> tuple[int, ...]:
    match = re.match(r"\d+(?:\.\d+)*", text.strip())
    if not match:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(part) for part in match.group(0).split("."))


def node_glibc() -> str | None:
    """The glibc this node runs (e.g. "2.35"), None where there is none (musl)."""
    try:
        name, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").split()  # "glibc 2.35"
    except (ValueError, OSError, AttributeError):
        return None
    return version if name == "glibc" else None


def installed_package(prefix: Path, name: str) -> dict | None:
    """The conda-meta record of package `name` in `prefix`, None if it is not installed."""
    for path in sorted(glob.glob(os.path.join(glob.escape(str(prefix)), "conda-meta", f"{name}-*.json"))):
        try:
            record = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if record.get("name") == name:
            return record
    return None


def sysroot_glibc(prefix: Path) -> str | None:
    """The glibc version the env's sysroot targets (the version of its sysroot_<platform> package:
    sysroot_linux-64, sysroot_linux-aarch64), None without one."""
    record = next(
        filter(
            None,
            (
                installed_package(prefix, f"sysroot_{p}")
                for p in ("linux-64", "linux-aarch64", "linux-ppc64le")
            ),
        ),
        None,
    )
    return str(record["version"]) if record and record.get("version") else None


# -- NVIDIA --------------------------------------------------------------------------------------


def nvidia_device_nodes() -> list[str]:
    return sorted(glob.glob("/dev/nvidia[0-9]*"))


def cpu_only_node() -> bool:
    """No /dev/nvidia[0-9]* and no loadable libcuda.so.1: no CUDA device can be used here, so a caller
    need not import torch to count GPUs (bin/train's launcher on a CPU node, envcheck's GPU checks)."""
    return not nvidia_device_nodes() and cuda_driver_version() is None


def cuda_driver_version() -> int | None:
    """The CUDA version the installed driver supports (cuDriverGetVersion: 12080 = 12.8), None without
    a loadable libcuda.so.1."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int(0)
    if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return version.value


_GPU_KINDS = ("gb200", "gh200", "b200", "b100", "h200", "h100", "a100")


def gpu_kind(text: str) -> str | None:
    """The GPU kind a device name, env name or cache path speaks of ("NVIDIA B200" -> "b200")."""
    lowered = text.lower()
    for kind in _GPU_KINDS:
        if re.search(rf"(?<![a-z0-9]){kind}(?![0-9])", lowered):
            return kind
    return None
