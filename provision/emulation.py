"""An emulated, compiler-less aarch64 worker on an x86 Linux host (root): the harness of
`bin/envcheck --simulate-worker --platform linux-aarch64`.

Contract:
- `qemu_root(cache)`: Debian's qemu-user-static, `apt-get download` + `dpkg -x` into the cache (no
  system install); returns the extracted tree.
- `arm64_root(cache)`: a Debian bookworm arm64 runtime root as a worker has it (glibc, libstdc++,
  dash/bash/coreutils, python3.11; no compiler, no headers, no `openssl` command), from a private
  APT_CONFIG with APT::Architecture "arm64"; built once into the cache, appearing atomically.
- `binfmt(qemu)`: a context manager that makes the kernel run aarch64 ELF programs through qemu (mounts
  binfmt_misc if needed, registers Debian's qemu-aarch64.conf with the F flag) and undoes exactly what it
  did on exit (`-1` to its entry, umount if it mounted). An entry someone else registered is used and
  left alone. Raises EmulationError naming why it cannot.
- `chroot_command(root, argv, binds)`: the argv that runs `argv` chrooted in `root` in a private mount
  namespace, with /proc, /dev, a private /tmp, each bind (a host path mounted at the same path inside)
  and an aarch64 CPU description (torch's cpuinfo reads `midr_el1` and /proc/cpuinfo, which qemu leaves
  x86: Neoverse-V2, Grace's core, is faked). Run it with QEMU_CPU=GRACE_QEMU_CPU in the environment:
  the SVE vector length decides torch's CPU capability (SVE128 and NEON kernels on Grace).
Run as a chroot on purpose: outside one, qemu's path lookup lets an emulated compiler read the host's
/usr/include, and the proof would pass for the wrong reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

BINFMT = Path("/proc/sys/fs/binfmt_misc")
ENTRY = "qemu-aarch64"
# What a compiler-less ubuntu-like aarch64 worker has (Debian bookworm names); `openssl` left out.
RUNTIME_DEBS = (
    "libc6", "libgcc-s1", "libstdc++6", "dash", "bash", "coreutils", "libssl3", "zlib1g", "libffi8",
    "libbz2-1.0", "liblzma5", "libsqlite3-0", "libexpat1", "libtinfo6", "libncursesw6", "libreadline8",
    "libuuid1", "libcrypt1", "libnsl2", "libtirpc3", "libtirpc-common", "python3.11", "python3.11-minimal",
    "libpython3.11-minimal", "libpython3.11-stdlib", "libselinux1", "libacl1", "libattr1", "libgmp10",
    "libpcre2-8-0", "libzstd1", "libgssapi-krb5-2", "libkrb5-3", "libk5crypto3", "libcom-err2",
    "libkrb5support0", "libkeyutils1", "media-types", "libdb5.3",
)  # fmt: skip
NEOVERSE_V2_MIDR = "0x00000000410fd4f0"
# qemu-user's CPU for every aarch64 process of the worker (read from the environment at each exec): Grace's
# SVE2 is 128 bits wide; qemu's default (512) makes torch pick SVE256 kernels, which Grace never builds.
GRACE_QEMU_CPU = "max,sve-default-vector-length=16"
CPUINFO = (
    "processor\t: {n}\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics "
    "fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat "
    "ilrcpc flagm ssbs sb paca pacg dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint "
    "svei8mm svebf16 i8mm bf16 dgh bti\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\n"
    "CPU part\t: 0xd4f\nCPU revision\t: 0\n\n"
)


class EmulationError(RuntimeError):
    """The emulated worker cannot be set up here; the message says why and what to do."""


def _apt_download(names: Sequence[str], dest: Path, env: dict[str, str]) -> None:
    """All of `names` in one apt-get call (apt fetches them over one pipelined connection: one call per
    package cost a connection each, most of the harness's 5.5 min cold build)."""
    proc = subprocess.run(
        ["apt-get", "download", "-q", *names], cwd=dest, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise EmulationError(f"apt-get download {' '.join(names)} failed: {proc.stderr.strip()[-500:]}")


def qemu_root(cache: Path) -> Path:
    final = cache / "qemu-user-static"
    if (final / "usr" / "bin" / "qemu-aarch64-static").is_file():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".qemu-", dir=cache) as tmp:
        _apt_download(["qemu-user-static"], Path(tmp), dict(os.environ))
        (deb,) = Path(tmp).glob("qemu-user-static_*.deb")
        subprocess.run(["dpkg", "-x", str(deb), str(Path(tmp, "x"))], check=True)
        with contextlib.suppress(OSError):
            os.rename(Path(tmp, "x"), final)
    return final


def _arm64_apt(cache: Path) -> dict[str, str]:
    """A private apt state for arm64 (the host's sources, its own lists): APT_CONFIG for apt-get."""
    apt = cache / "apt-arm64"
    for sub in ("lists/partial", "cache/archives/partial", "etc/sources.list.d", "etc/preferences.d"):
        (apt / sub).mkdir(parents=True, exist_ok=True)
    for src in Path("/etc/apt/sources.list.d").glob("*.sources"):
        shutil.copy2(src, apt / "etc" / "sources.list.d" / src.name)
    if Path("/etc/apt/sources.list").is_file():
        shutil.copy2("/etc/apt/sources.list", apt / "etc" / "sources.list")
    (apt / "status").touch()
    conf = apt / "apt.conf"
    conf.write_text(
        'APT::Architecture "arm64";\nAPT::Architectures { "arm64"; };\nAcquire::Languages "none";\n'
        'APT::Sandbox::User "root";\n'
        + "".join(
            f'{key} "{apt / rel}";\n'
            for key, rel in (
                ("Dir::State", ""), ("Dir::State::Lists", "lists"), ("Dir::State::status", "status"),
                ("Dir::Cache", "cache"), ("Dir::Etc::SourceList", "etc/sources.list"),
                ("Dir::Etc::SourceParts", "etc/sources.list.d"), ("Dir::Etc::Preferences", "etc/preferences"),
                ("Dir::Etc::PreferencesParts", "etc/preferences.d"),
            )
        )
    )  # fmt: skip
    env = {**os.environ, "APT_CONFIG": str(conf)}
    proc = subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise EmulationError(f"apt-get update for arm64 failed: {proc.stderr.strip()[-500:]}")
    return env


def arm64_root(cache: Path, extra_debs: Sequence[str] = ()) -> Path:
    """The worker's arm64 root (RUNTIME_DEBS + extra_debs), cached under a key of the package names."""
    names = sorted({*RUNTIME_DEBS, *extra_debs})
    final = cache / f"arm64-root-{hashlib.sha256(' '.join(names).encode()).hexdigest()[:16]}"
    if (final / "usr" / "bin" / "python3.11").is_file():
        return final
    env = _arm64_apt(cache)
    with tempfile.TemporaryDirectory(prefix=".arm64-root-", dir=cache) as tmp:
        debs, root = Path(tmp, "debs"), Path(tmp, "root")
        debs.mkdir()
        _apt_download(names, debs, env)
        for deb in sorted(debs.glob("*.deb")):
            subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
        for sub in ("proc", "dev", "sys", "tmp"):
            (root / sub).mkdir(exist_ok=True)
        with contextlib.suppress(OSError):
            os.rename(root, final)
    return final


@contextlib.contextmanager
def binfmt(qemu: Path) -> Iterator[str]:
    """aarch64 programs run through qemu while inside; exactly what was done is undone on exit."""
    if os.geteuid() != 0:
        raise EmulationError("an emulated aarch64 worker needs root (binfmt_misc, mounts, chroot)")
    interpreter = os.path.realpath(qemu / "usr" / "bin" / "qemu-aarch64-static")
    conf = (qemu / "usr" / "lib" / "binfmt.d" / f"{ENTRY}.conf").read_text().strip()
    fields = conf.split(":")  # :name:type:offset:magic:mask:interpreter:flags
    fields[6], fields[7] = interpreter, "OF"  # F: the kernel opens qemu now (works inside a chroot)
    mounted = False
    if not (BINFMT / "register").exists():
        proc = subprocess.run(
            ["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise EmulationError(f"cannot mount binfmt_misc on {BINFMT}: {proc.stderr.strip()}")
        mounted = True
    registered = False
    try:
        if not (BINFMT / ENTRY).exists():
            (BINFMT / "register").write_text(":".join(fields))
            registered = True
        else:  # someone else's entry: used only if it works inside a chroot (enabled, F: opened at register)
            state = (BINFMT / ENTRY).read_text()
            flags = state.split("flags:", 1)[-1].split("\n", 1)[0] if "flags:" in state else ""
            if not state.startswith("enabled") or "F" not in flags:
                raise EmulationError(
                    f"{BINFMT / ENTRY} is registered already but {state.splitlines()[0] if state else '?'}"
                    f", flags '{flags.strip()}': a chroot needs it enabled with the F flag; as root, "
                    f"`echo -1 > {BINFMT / ENTRY}` (this harness then registers its own and removes it after)"
                )
        yield (BINFMT / ENTRY).read_text().split("interpreter ", 1)[-1].split("\n", 1)[0]
    finally:
        if registered:
            (BINFMT / ENTRY).write_text("-1")
        if mounted:
            subprocess.run(["umount", str(BINFMT)], check=False)


def chroot_command(root: Path, argv: Sequence[str], binds: Sequence[Path] = (), cpus: int = 4) -> list[str]:
    """`argv` chrooted in `root` (see module doc), as one `unshare --mount` command line."""
    lines = [
        "set -e",
        "mount --make-rprivate /",
        f"mount --bind /proc {root}/proc",
        f"mount --rbind /dev {root}/dev",
        f"mount -t tmpfs tmpfs {root}/tmp",
        f"fake={root}/tmp/.lingbot-cpu && mkdir -p $fake",  # on the tmpfs above: gone with the namespace
    ]
    cpuinfo = "".join(CPUINFO.format(n=n) for n in range(cpus))
    lines += [
        f"cat > $fake/cpuinfo <<'EOF'\n{cpuinfo}EOF",
        f"mount --bind $fake/cpuinfo {root}/proc/cpuinfo",
        f"mkdir -p {root}/sys",
        f"mount -t tmpfs tmpfs {root}/sys",
    ]
    for n in range(cpus):
        regs = f"{root}/sys/devices/system/cpu/cpu{n}/regs/identification"
        lines += [f"mkdir -p {regs}", f"echo {NEOVERSE_V2_MIDR} > {regs}/midr_el1"]
    lines.append(f"echo 0-{cpus - 1} > {root}/sys/devices/system/cpu/possible")
    lines.append(f"cp {root}/sys/devices/system/cpu/possible {root}/sys/devices/system/cpu/present")
    for path in binds:
        lines += [f"mkdir -p {root}{path}", f"mount --rbind {path} {root}{path}"]
    quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
    lines.append(f"exec chroot {root} {quoted}")
    return ["unshare", "--mount", "--", "sh", "-c", "\n".join(lines)]
