"""Compile caches (Triton, Inductor) that persist per env and GPU kind across attempts, used node-locally.

A requeued attempt should not recompile what the previous attempt compiled. Each launcher therefore:

    caches = localise_compile_caches(env, scratch, job, env_name, gpu_kind)   # attempt start
    ... torchrun ...
    notes = write_back_compile_caches(env)                                     # attempt end (also a stop)

The persistent caches (one pair per env and GPU kind; kernels of one kind never mix with another's):
    Triton    $TRITON_CACHE_DIR as the env's hooks set it (environment.yml: ~/.triton/cache_<env>_<kind>),
              else ~/.triton/cache_<env>_<kind>
    Inductor  $TORCHINDUCTOR_CACHE_DIR when the job's environment sets it, else
              ~/.cache/lingbot/torchinductor_<env>_<kind> (Inductor's own default, /tmp/torchinductor_$USER,
              is node-local and lost on the next node). It holds the FX graph, AOTAutograd and C++/Triton
              code caches, so a warm attempt skips Inductor's lowering and the C++ compiles.
    Inductor's precompiled headers   <Inductor's persistent cache>_precompiled_headers: Inductor keeps
              them under $TMPDIR/torchinductor_<user>/precompiled_headers whatever its cache dir says, and
              builds them again (measured: 11 s -> 38 s for a warm first call) on a node with a fresh
              TMPDIR even when every kernel is a cache hit; so the ranks get a node-local TMPDIR of this
              launcher, seeded with them. (They are keyed by compiler version, flags and the preprocessed
              header's hash; gcc itself ignores an invalid one.)
<env> is the provisioned env's name (tool-env for the tool environment); <kind> is $LINGBOT_GPU_KIND
(the env's hooks), else the launcher's detected kind (cpu without a GPU).

At attempt start the persistent cache is copied into a node-local directory of this launcher
(<scratch>/lingbot-<job>-compile/<var>), and the ranks use that copy: ranks compiling into one cache on
a network filesystem race on its locks and renames; a local copy does not. At attempt end (after
torchrun exits, whether the attempt completed, was stopped or failed) every entry the copy has and the
persistent cache lacks is published there, and the local copy is removed. Publishing never exposes a
half-written entry and never overwrites one: a new directory is copied under a temporary name inside its
target directory and renamed into place whole; a new file is copied to a temporary name and hard-linked
to its final name (link fails if the name exists: no clobber), falling back to a rename after an exists
check where the filesystem has no hard links. Caches are content-addressed, so an entry two jobs both
publish is the same entry: the first one wins, the second is dropped. Lock files and writers' temporary
files are never copied. (provision/atomic.py's write_atomic replaces its target by design; publishing
must not, hence the link-based helper here.) The local copy records its launcher (trainer/launcher/
tempdirs.py): a launcher killed with SIGKILL cannot remove it, the next launch on the node does.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

CACHE_VARS = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
PERSISTENT_PREFIX = "LINGBOT_PERSISTENT_"  # env[PERSISTENT_PREFIX + var]: where the local copy came from
LOCAL_ROOT = "LINGBOT_LOCAL_COMPILE_ROOT"  # env[LOCAL_ROOT]: this launcher's node-local directory
PCH = "PRECOMPILED_HEADERS"  # env["LINGBOT_LOCAL_" + PCH]: the ranks' local copy of Inductor's headers


def persistent_dirs(env: dict[str, str], env_name: str, gpu_kind: str) -> dict[str, Path]:
    """The persistent cache of each variable for this env and GPU kind (see the module docstring)."""
    home = Path(env.get("HOME") or Path.home())
    kind = env.get("LINGBOT_GPU_KIND") or gpu_kind
    key = f"{env_name}_{kind}"
    defaults = {
        "TRITON_CACHE_DIR": home / ".triton" / f"cache_{key}",
        "TORCHINDUCTOR_CACHE_DIR": home / ".cache" / "lingbot" / f"torchinductor_{key}",
    }
    dirs = {var: Path(env[var]) if env.get(var) else defaults[var] for var in CACHE_VARS}
    inductor = dirs["TORCHINDUCTOR_CACHE_DIR"]
    dirs[PCH] = inductor.parent / f"{inductor.name}_precompiled_headers"
    return dirs


def inductor_header_dir(tmpdir: Path) -> Path:
    """Where Inductor looks for precompiled headers with TMPDIR=tmpdir (its default_cache_dir())."""
    import getpass
    import re

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return tmpdir / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)) / "precompiled_headers"


def _transient(name: str) -> bool:
    """Lock files and temporary files of a writer (Inductor's `.<pid>.<tid>.tmp`, Triton's
    `tmp.pid_<pid>_<n>/` staging directory, which a killed writer leaves behind, ours)."""
    return (
        name.endswith((".lock", ".tmp"))
        or name == "locks"
        or name.startswith("tmp.pid_")
        or ".lingbot-tmp-" in name
    )


def _ignore(_directory: str, names: list[str]) -> set[str]:
    return {n for n in names if _transient(n)}


def _ignore_headers_in(root: Path):
    """_ignore, and the precompiled_headers/ at the top of an Inductor cache dir: Inductor reads headers
    only from $TMPDIR/torchinductor_<user>/precompiled_headers (codecache's default_cache_dir(), never
    cache_dir()), so in the ranks' TORCHINDUCTOR_CACHE_DIR copy they are dead weight: 155 MB a header
    with torch 2.13, copied by every launch when TORCHINDUCTOR_CACHE_DIR names Inductor's default dir
    (torch itself exports it from a process that compiled; the suite's launches inherited 910 MiB)."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        skipped = _ignore(directory, names)
        if os.path.realpath(directory) == os.path.realpath(root):
            skipped |= {n for n in names if n == "precompiled_headers"}
        return skipped

    return ignore


@dataclass
class Published:
    """What one write-back added: files (counted inside new directories too) and bytes."""

    files: int = 0
    bytes: int = 0

    def add(self, other: Published) -> None:
        self.files += other.files
        self.bytes += other.bytes


def _tmp_name(dest: Path) -> Path:
    return dest.parent / f".{dest.name}.lingbot-tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _tree_size(path: Path) -> Published:
    out = Published()
    for root, _dirs, files in os.walk(path):
        for name in files:
            out.files += 1
            out.bytes += os.lstat(os.path.join(root, name)).st_size
    return out


def _publish_file(src: Path, dest: Path) -> Published:
    if os.path.lexists(dest):
        return Published()
    tmp = _tmp_name(dest)
    shutil.copy2(src, tmp)
    try:
        try:
            os.link(tmp, dest)  # atomic, and fails if dest exists: never overwrites
        except FileExistsError:
            return Published()
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            if os.path.lexists(dest):  # no hard links here: rename, after the exists check
                return Published()
            os.rename(tmp, dest)
        return Published(1, src.stat().st_size)
    finally:
        Path(tmp).unlink(missing_ok=True)


def publish(src: Path, dest: Path) -> Published:
    """Add to `dest` every entry under `src` that `dest` lacks (atomically, never overwriting)."""
    if src.is_symlink() or _transient(src.name):
        return Published()
    if not src.is_dir():
        return _publish_file(src, dest)
    if not dest.exists():
        tmp = _tmp_name(dest)
        shutil.copytree(src, tmp, symlinks=True, ignore=_ignore)
        try:
            os.rename(tmp, dest)  # the whole directory appears at once
            return _tree_size(dest)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    if not dest.is_dir():
        return Published()  # a file where we have a directory: not ours to replace
    added = Published()
    for child in sorted(src.iterdir()):
        added.add(publish(child, dest / child.name))
    return added


def _human(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def env_key_name(prefix: Path, provisioned: bool) -> str:
    """<env> of the cache key: the provisioned env's name, or tool-env."""
    return prefix.name if provisioned else "tool-env"


def detected_gpu_kind() -> str:
    """<kind> of the cache key when the env's hooks do not set LINGBOT_GPU_KIND: the first GPU's name
    (lower case, alphanumerics and dashes), cpu without one."""
    from provision.nodeinfo import cpu_only_node

    if cpu_only_node():
        return "cpu"
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return "cpu"
    name = torch.cuda.get_device_name(0).lower()
    return "-".join("".join(c if c.isalnum() else " " for c in name).split()) or "gpu"


def localise_compile_caches(
    env: dict[str, str], scratch: Path, job: str, env_name: str = "tool-env", gpu_kind: str | None = None
) -> list[str]:
    """Seed a node-local copy of each persistent cache and point `env` at it; returns notes to print.
    The copy is this launcher's own (two launchers of one job on one host never share it)."""
    from provision.nodeinfo import filesystem_type, is_network_fs
    from trainer.launcher.tempdirs import mark_launcher_dir

    notes = []
    kind = gpu_kind or (env.get("LINGBOT_GPU_KIND") or detected_gpu_kind())
    local_root = scratch / f"lingbot-{job}-{os.getpid()}-compile"
    local_root.mkdir(parents=True, exist_ok=True)
    mark_launcher_dir(local_root)  # a later launch removes it if this launcher dies (tempdirs.py)
    env[LOCAL_ROOT] = str(local_root)
    for var, shared in persistent_dirs(env, env_name, kind).items():
        local = local_root / var.lower() if var != PCH else inductor_header_dir(local_root / "tmp")
        started = time.perf_counter()
        if shared.is_dir():
            ignore = _ignore_headers_in(shared) if var == "TORCHINDUCTOR_CACHE_DIR" else _ignore
            shutil.copytree(shared, local, symlinks=True, ignore=ignore, dirs_exist_ok=True)
        local.mkdir(parents=True, exist_ok=True)
        seeded = _tree_size(local)
        env[var if var != PCH else "LINGBOT_LOCAL_" + PCH] = str(local)
        env[PERSISTENT_PREFIX + var] = str(shared)
        if var == PCH:
            env["TMPDIR"] = str(local_root / "tmp")  # the ranks' temp dir: node-local, removed at exit
        try:
            fstype = filesystem_type(shared if shared.exists() else shared.parent)
        except (OSError, ValueError):
            fstype = ""
        where = f" ({fstype}, a network filesystem)" if fstype and is_network_fs(fstype) else ""
        notes.append(
            f"{var}: node-local copy {local} seeded from {shared}{where}: {seeded.files} files, "
            f"{_human(seeded.bytes)} in {time.perf_counter() - started:.1f} s; new entries go back at exit"
        )
    return notes


def write_back_compile_caches(env: dict[str, str]) -> list[str]:
    """Publish what the node-local copies gained into the persistent caches, then remove the copies."""
    notes = []
    for var, local_var in [(v, v) for v in CACHE_VARS] + [(PCH, "LINGBOT_LOCAL_" + PCH)]:
        shared_text = env.get(PERSISTENT_PREFIX + var)
        if not shared_text or not env.get(local_var):
            continue
        local, shared = Path(env[local_var]), Path(shared_text)
        if not local.is_dir():
            continue
        started = time.perf_counter()
        try:
            shared.parent.mkdir(parents=True, exist_ok=True)
            added = publish(local, shared)
        except OSError as exc:
            notes.append(f"{var}: could not write new kernels back to {shared} ({exc}); the next attempt "
                         "compiles them again")  # fmt: skip
        else:
            if added.files:
                notes.append(
                    f"{var}: {added.files} new cache files ({_human(added.bytes)}) written back to {shared} "
                    f"in {time.perf_counter() - started:.1f} s"
                )
    if env.get(LOCAL_ROOT):
        shutil.rmtree(env[LOCAL_ROOT], ignore_errors=True)  # the copies and the ranks' TMPDIR
    return notes
