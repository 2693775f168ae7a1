"""An aarch64 env built by bin/provision's own code on this x86 host (`--platform linux-aarch64`), running
no aarch64 program (the pip part is installed by the host: provision/wheel_install.py):

- a local channel with the linux-aarch64 stand-ins (tests/support/aarch64_standins.py: python 3.11, the
  compilers, sysroot, openssl, pip);
- environment.yml (`platforms: [linux-aarch64]`) with those and a pip part pinned to the repo lock's
  linux-aarch64 versions of what the CPU rows need: torch 2.13.0 and triton 3.7.1 (manylinux aarch64),
  their dependencies (the CUDA 13 nvidia wheels included: torch's aarch64 wheel needs them to import),
  ninja, click, pyyaml and packaging (bin/envcheck itself and its interpreter probe run on the env's
  python inside the emulated worker);
- `lock.make_lock` (the pip part resolved for aarch64 against PyPI by the host's pip) and
  `install.provision` with `pip_find_links` = a directory of the locked wheels (downloaded once by the
  host's pip: ~2.9 GB), installed by the host's pip and pypa's installer (no qemu needed; the env's own
  aarch64 python runs only later, in the emulated worker).

`fetch(cache)` is every download the lane makes before it provisions (qemu-user-static, the arm64 root, the
stand-ins' Debian packages, the lock's aarch64 wheels: ~3 GB, network-bound); `.ci/run` runs it beside the
suite (`bin/test --aarch64-fetch`, i.e. `python -m tests.support.aarch64_env fetch`) so the lane, after the
suite, finds them in the machine's cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from provision import emulation, install, lock
from provision.atomic import write_json_atomic
from provision.spec import load_spec

from .aarch64_standins import standin_packages
from .channel import index_channel

PIP_PINS = (
    "torch==2.13.0",
    "triton==3.7.1",
    "ninja==1.13.2",
    "click==8.5.1",
    "pyyaml==6.0.4",
    "numpy==2.4.6",
    "packaging==26.4",
)
CONDA = (
    "python 3.11.*",
    "pip",
    "setuptools",
    "gcc_linux-aarch64",
    "gxx_linux-aarch64",
    "sysroot_linux-aarch64",
)


REPO = Path(__file__).resolve().parents[2]


def fixtures_cache() -> Path:
    return Path(os.environ.get("LINGBOT_FIXTURES_CACHE") or Path.home() / ".cache" / "lingbot-fixtures")


def fetch(cache: Path) -> tuple[Path, Path]:
    """The lane's downloads into the machine's cache (module docstring); each piece is kept once complete
    (renamed into place), so a second call only checks. Returns (qemu-user-static's tree, the wheels)."""
    qemu = emulation.qemu_root(cache / "emulation")
    emulation.arm64_root(cache / "emulation")
    standin_packages(cache)
    return qemu, download_wheels(cache / "aarch64-wheels", REPO / "conda-lock.yml")


def download_wheels(dest: Path, lockfile: Path) -> Path:
    """The lock's linux-aarch64 wheels of PIP_PINS and their dependencies (by URL and sha256), fetched
    once by the host's pip into `dest` (~2.9 GB, 35 files)."""
    from provision.lockfile import read_lock
    from provision.pip_lock import manylinux_platforms

    names = {"torch", "triton", "filelock", "typing-extensions", "sympy", "mpmath", "networkx", "jinja2",
             "markupsafe", "fsspec", "setuptools", "numpy", "click", "pyyaml", "ninja", "packaging",
             "cuda-bindings", "cuda-pathfinder", "cuda-toolkit"}  # fmt: skip
    entries = [d for d in read_lock(lockfile).for_platform("linux-aarch64", "pip")
               if d.name in names or d.name.startswith("nvidia-")]  # fmt: skip
    dest.mkdir(parents=True, exist_ok=True)
    reqs = dest / "requirements.txt"
    wanted = "".join(f"{d.name} @ {d.url} --hash=sha256:{d.sha256}\n" for d in entries)
    stamp = dest / "verified.json"  # what pip last checked against `wanted`: every wheel's size and mtime
    if stamp.is_file() and json.loads(stamp.read_text()) == {"requirements": wanted, "wheels": _wheels(dest)}:
        return dest  # the same files pip verified (.ci/run's fetch beside the suite): not hashed again (11 s)
    stamp.unlink(missing_ok=True)
    reqs.write_text(wanted)
    tags = [a for t in manylinux_platforms("2.35", "aarch64") for a in ("--platform", t)]
    cmd = [sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--require-hashes",
           "--only-binary", ":all:", *tags, "--python-version", "3.11", "--implementation", "cp",
           "-d", str(dest), "-r", str(reqs), "-q"]  # fmt: skip
    subprocess.run(cmd, env={**os.environ, "PIP_CONFIG_FILE": os.devnull}, check=True)
    write_json_atomic(stamp, {"requirements": wanted, "wheels": _wheels(dest)})
    return dest


def _wheels(dest: Path) -> dict[str, list[int]]:
    return {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(dest.glob("*.whl"))}


def channel(root: Path, cache_root: Path | None = None) -> Path:
    chan = root / "aarch64-channel"
    (chan / "linux-aarch64").mkdir(parents=True, exist_ok=True)
    for pkg in standin_packages(cache_root):
        dest = chan / "linux-aarch64" / pkg.name
        dest.unlink(missing_ok=True)  # a rebuilt stand-in keeps its file name
        dest.hardlink_to(pkg)
    index_channel(chan)
    return chan


def spec_text(name: str, chan: Path, openssl: bool = True) -> str:
    deps = [*CONDA, *(["openssl"] if openssl else [])]
    return (
        f"name: {name}\nchannels:\n  - {chan}\nplatforms:\n  - linux-aarch64\ndependencies:\n"
        + "".join(f"  - {d}\n" for d in deps)
        + "  - pip:\n"
        + "".join(f"    - {p}\n" for p in PIP_PINS)
    )


def provision_env(root: Path, wheels: Path, *, name: str = "lingbot-aarch64", openssl: bool = True,
                  log=print) -> tuple[Path, dict]:  # fmt: skip
    """Lock and provision the env under `root`; returns (prefix, timings in seconds)."""
    spec_dir = root / name
    spec_dir.mkdir(parents=True, exist_ok=True)
    chan = channel(root)
    text = spec_text(name, chan, openssl)
    (spec_dir / "environment.yml").write_text(text)
    spec = load_spec(spec_dir / "environment.yml")
    lock_path, times = spec_dir / "conda-lock.yml", {}
    # relocked when the spec or the stand-ins change (a stand-in rebuilt has another sha256)
    key = hashlib.sha256(text.encode() + (chan / "linux-aarch64" / "repodata.json").read_bytes()).hexdigest()
    key_path = spec_dir / "conda-lock.key"
    if not key_path.is_file() or key_path.read_text() != key:
        lock_path.unlink(missing_ok=True)
    start = time.monotonic()
    if not lock_path.is_file():
        vp = lock.VirtualPackages(cuda="13.0", archspec="aarch64")
        lock.make_lock(spec, lock_path, vpkgs_by_platform={"linux-aarch64": vp}, mirrors=None,
                       cache_dir=root / "rattler-cache", log=log)  # fmt: skip
        key_path.write_text(key)
    times["lock_s"] = round(time.monotonic() - start, 1)
    start = time.monotonic()
    plan = install.plan(spec, spec.name, lock_path, root / "envs" / name, platform="linux-aarch64")
    install.provision(plan, cache_dir=root / "pkgs", pip_find_links=str(wheels),
                      progress=install.Progress(enabled=True))  # fmt: skip
    times["provision_s"] = round(time.monotonic() - start, 1)
    return plan.target, times


if __name__ == "__main__":
    if sys.argv[1:] != ["fetch"]:
        sys.exit("usage: python -m tests.support.aarch64_env fetch")
    started = time.monotonic()
    fetch(fixtures_cache())
    took = time.monotonic() - started
    print(f"aarch64 lane: downloads ready in {fixtures_cache()} ({took:.0f} s)", file=sys.stderr)
