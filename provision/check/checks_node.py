"""Checks of the node the job runs on: compile caches (writable, room, not on a network filesystem),
the GPU (CUDA, driver, NCCL, GPU kind), glibc against the env's sysroot, free disk."""

from __future__ import annotations

import getpass
import os
import tempfile
from pathlib import Path

from provision import nodeinfo
from provision.check.context import Context, Outcome
from provision.check.report import FAIL, PASS, WARN

GIB = 1 << 30
MIN_FREE, LOW_FREE = 1 * GIB, 5 * GIB  # below MIN_FREE: FAIL; below LOW_FREE: WARN
NETWORK_FS_RACES = (
    "Triton's and Inductor's caches race on network filesystems (triton#11512, pytorch#173679): "
    "half-written kernels, lock timeouts, jobs hanging at their first compile"
)
NODE_LOCAL_FIX = (
    "use a node-local cache per job: bin/train points TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR at "
    "node-local disk ($SLURM_TMPDIR or /tmp) for each job; or set them to a local path yourself"
)


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def triton_cache_dir(ctx: Context) -> tuple[str, bool]:
    value = ctx.job_env.get("TRITON_CACHE_DIR")
    if value:
        return value, True
    home = ctx.job_env.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".triton", "cache"), False


def inductor_cache_dir(ctx: Context) -> str:
    env = ctx.job_env
    if env.get("TORCHINDUCTOR_CACHE_DIR"):
        return env["TORCHINDUCTOR_CACHE_DIR"]
    user = env.get("USER") or getpass.getuser()
    return os.path.join(env.get("TMPDIR") or "/tmp", f"torchinductor_{user}")


def check_triton_cache(ctx: Context) -> Outcome:
    path, is_set = triton_cache_dir(ctx)
    note = (
        "" if is_set else " (TRITON_CACHE_DIR is unset: Triton's default, shared by every env and GPU kind)"
    )
    target = Path(path)
    base = nodeinfo.existing_ancestor(target)
    if base != target and not base.is_dir():
        return Outcome(
            FAIL, f"{path}: {base} is not a directory", "set TRITON_CACHE_DIR to a writable directory"
        )
    try:
        fd, probe_file = tempfile.mkstemp(prefix=".envcheck-", dir=base)
        os.write(fd, b"envcheck\n")
        os.fsync(fd)
        os.close(fd)
        os.unlink(probe_file)
    except OSError as exc:
        return Outcome(
            FAIL,
            f"{path} is not writable: {exc}{note}",
            "make it writable or point TRITON_CACHE_DIR elsewhere",
        )
    free = nodeinfo.free_bytes(base)
    state = "exists" if base == target else f"does not exist yet; Triton creates it under {base}"
    message = f"{path} {state}, writable, {_gib(free)} free{note}"
    if free < MIN_FREE:
        return Outcome(FAIL, message, f"free space on {base} or point TRITON_CACHE_DIR elsewhere")
    if free < LOW_FREE or not is_set:
        fix = (
            "free space there"
            if is_set
            else ("provision the env from a spec that sets TRITON_CACHE_DIR (environment.yml variables:)")
        )
        return Outcome(WARN, message, fix)
    return Outcome(PASS, message)


def cache_filesystem_verdict(label: str, path: str, mountinfo: str | os.PathLike[str] | None = None) -> tuple:
    """(status, message, fix, details) for a compile cache at `path`: WARN on a network filesystem.
    Also used by bin/train to decide on a node-local cache."""
    try:
        mount = nodeinfo.mount_of(path, mountinfo)
    except (OSError, ValueError) as exc:
        return (
            WARN,
            f"cannot tell which filesystem holds {label} {path}: {exc}",
            "check by hand that it is on node-local disk (df -T PATH)",
            {"path": path},
        )
    details = {"path": path, "mount_point": mount.mount_point, "fstype": mount.fstype, "source": mount.source}
    if nodeinfo.is_network_fs(mount.fstype):
        message = (
            f"{label} {path} is on {mount.fstype} ({mount.source} at {mount.mount_point}): {NETWORK_FS_RACES}"
        )
        return WARN, message, NODE_LOCAL_FIX, details
    return PASS, f"{label} {path} is on {mount.fstype} (local, mounted at {mount.mount_point})", "", details


def check_triton_cache_fs(ctx: Context) -> Outcome:
    return Outcome(*cache_filesystem_verdict("TRITON_CACHE_DIR", triton_cache_dir(ctx)[0], ctx.mountinfo))


def check_inductor_cache_fs(ctx: Context) -> Outcome:
    return Outcome(*cache_filesystem_verdict("Inductor's cache", inductor_cache_dir(ctx), ctx.mountinfo))


def gpu_absent_reason(ctx: Context) -> str:
    if not nodeinfo.cpu_only_node():
        return ""
    return "CPU-only node: no /dev/nvidia[0-9]* and no loadable libcuda.so.1"


def check_cuda(ctx: Context) -> Outcome:
    info = ctx.interpreter
    if info is None:
        return Outcome(
            FAIL,
            "the env's python cannot report torch's CUDA state (no python or torch)",
            ctx.provision_fix(),
        )
    if not info.get("torch_cuda"):
        return Outcome(FAIL, f"torch {info.get('torch')} is a CPU build on a GPU node", ctx.provision_fix())
    if not info.get("cuda_available"):
        return Outcome(
            FAIL,
            f"torch {info.get('torch')} sees no GPU: {info.get('cuda_error', 'cuda unavailable')}",
            "check CUDA_VISIBLE_DEVICES and the job's GPU allocation (--gres/--gpus)",
        )
    devices = info.get("cuda_devices") or []
    return Outcome(
        PASS,
        f"{len(devices)} GPU(s) visible: {', '.join(devices)} (torch {info['torch']}, CUDA "
        f"{info['torch_cuda']})",
    )


def check_driver(ctx: Context) -> Outcome:
    driver = nodeinfo.cuda_driver_version()
    info = ctx.interpreter or {}
    need = info.get("torch_cuda")
    if driver is None:
        return Outcome(
            FAIL,
            "libcuda.so.1 cannot be loaded: no NVIDIA driver usable here",
            "run on a node with the NVIDIA driver",
        )
    have = (driver // 1000, driver % 1000 // 10)
    if not need:
        return Outcome(
            FAIL, f"driver supports CUDA {have[0]}.{have[1]}; torch is not a CUDA build", ctx.provision_fix()
        )
    want = nodeinfo.parse_version(need)[:2]
    text = f"the driver supports CUDA {have[0]}.{have[1]}, torch {info.get('torch')} is built for CUDA {need}"
    if have >= want:
        return Outcome(PASS, text)
    fix = (
        f"run on nodes whose driver supports CUDA {need} (CUDA 13 needs driver >= 580, 12.x >= 525), or lock "
        f"a torch for CUDA {have[0]}.{have[1]}"
    )
    if have[0] == want[0]:
        return Outcome(WARN, text + " (minor-version compatibility: PTX JIT of newer kernels may fail)", fix)
    return Outcome(FAIL, text, fix)


def check_nccl(ctx: Context) -> Outcome:
    info = ctx.interpreter or {}
    if info.get("nccl"):
        return Outcome(PASS, f"NCCL {info['nccl']} loads")
    return Outcome(
        FAIL, f"NCCL does not load: {info.get('nccl_error', 'torch has no NCCL')}", ctx.provision_fix()
    )


def check_gpu_kind(ctx: Context) -> Outcome:
    info = ctx.interpreter or {}
    expected = nodeinfo.gpu_kind(ctx.job_env.get("LINGBOT_GPU_KIND", "")) or nodeinfo.gpu_kind(ctx.name)
    kinds = {nodeinfo.gpu_kind(d) for d in info.get("cuda_devices") or []}
    names = ", ".join(sorted(map(str, kinds)))
    if not kinds:
        return Outcome(FAIL, "no GPU name to compare", "see gpu.cuda")
    if expected is None:
        return Outcome(
            WARN,
            f"node has {names}; the env names no GPU kind",
            "set LINGBOT_GPU_KIND in environment.yml variables:",
        )
    if kinds != {expected}:
        return Outcome(
            FAIL,
            f"the env {ctx.name} is for {expected}, the node has {names}: kernels and caches are "
            f"per GPU kind",
            f"use the env for this GPU kind (e.g. lingbot-{sorted(map(str, kinds))[0]})",
        )
    return Outcome(PASS, f"node GPUs are {expected}, as the env expects")


def check_glibc(ctx: Context) -> Outcome:
    node, sysroot = nodeinfo.node_glibc(), nodeinfo.sysroot_glibc(ctx.prefix)
    if sysroot is None:
        return Outcome(
            FAIL,
            f"the env has no {ctx.sysroot_package}: nothing fixes the glibc its builds target",
            ctx.package_fix(ctx.sysroot_package),
        )
    if node is None:
        return Outcome(
            FAIL, "this node runs no glibc (musl?); the env's binaries need glibc", "run on a glibc node"
        )
    text = f"node glibc {node}, the env's sysroot targets {sysroot}"
    if nodeinfo.parse_version(node) < nodeinfo.parse_version(sysroot):
        return Outcome(
            FAIL,
            text + ": code built in the env will not load here",
            f"lock an older {ctx.sysroot_package} (<= {node}) in environment.yml, relock, provision",
        )
    return Outcome(PASS, text)


def check_disk(ctx: Context) -> Outcome:
    places = {
        "prefix": str(ctx.prefix),
        "TRITON_CACHE_DIR": triton_cache_dir(ctx)[0],
        "Inductor cache": inductor_cache_dir(ctx),
        "TMPDIR": ctx.job_env.get("TMPDIR") or "/tmp",
    }
    free = {label: nodeinfo.free_bytes(path) for label, path in places.items()}
    text = ", ".join(f"{label} {places[label]}: {_gib(n)}" for label, n in free.items())
    low = [label for label, n in free.items() if n < MIN_FREE]
    if low:
        return Outcome(
            FAIL,
            f"under {_gib(MIN_FREE)} free: {text}",
            f"free disk space for {', '.join(low)}",
            {"free_bytes": free},
        )
    if any(n < LOW_FREE for n in free.values()):
        return Outcome(WARN, f"low on space: {text}", "free disk space", {"free_bytes": free})
    return Outcome(PASS, text, "", {"free_bytes": free})
