"""Build real conda packages and index them into a local channel.

Packages are archived by conda-package-handling (the library conda itself uses) with a correct
``info/index.json`` and ``info/paths.json``, and channels are indexed by py-rattler's indexer, so
whatever installs from them (py-rattler, conda, mamba) sees what it would see on conda-forge.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

from conda_package_handling import api as cph

# The legacy placeholder conda and rattler both understand; text files that name it are rewritten
# to the real prefix at install time (path_type hardlink + file_mode text in paths.json).
PREFIX_PLACEHOLDER = "/opt/anaconda1anaconda2anaconda3"

_SUBDIR_ARCH = {
    "linux-64": ("linux", "x86_64"),
    "linux-aarch64": ("linux", "aarch64"),
    "linux-ppc64le": ("linux", "ppc64le"),
    "osx-64": ("osx", "x86_64"),
    "osx-arm64": ("osx", "arm64"),
    "win-64": ("win", "x86_64"),
}
_NOARCH_KINDS = ("generic", "python")


def make_package(
    out_dir: Path,
    name: str,
    version: str,
    files: Mapping[str, bytes | Path],
    *,
    build: str = "0",
    build_number: int = 0,
    depends: Iterable[str] = (),
    subdir: str = "linux-64",
    noarch: str | None = None,
    has_prefix_text: Iterable[str] = (),
    compression_level: int = 3,
) -> Path:
    """Write ``out_dir/<name>-<version>-<build>.conda`` and return its path.

    ``files`` maps a path relative to the install prefix to its content: ``bytes`` (written 0o755
    when it starts with ``#!``, else 0o644) or a ``Path`` on disk (mode kept; a symlink stays a
    symlink). ``has_prefix_text`` names files that contain :data:`PREFIX_PLACEHOLDER` and must be
    rewritten to the install prefix. ``noarch`` ("generic" or "python") forces subdir "noarch".
    The archive appears atomically: a failure leaves no partial ``.conda`` behind.
    """
    out_dir = Path(out_dir)
    if noarch is not None:
        if noarch not in _NOARCH_KINDS:
            raise ValueError(f"noarch must be one of {_NOARCH_KINDS}, got {noarch!r}")
        subdir = "noarch"
    elif subdir not in _SUBDIR_ARCH:
        raise ValueError(f"unknown subdir {subdir!r}; expected one of {sorted(_SUBDIR_ARCH)} or noarch=")
    if not files:
        raise ValueError(f"package {name}: files is empty (a conda package needs at least one file)")
    prefixed = set(has_prefix_text)
    unknown = prefixed - set(files)
    if unknown:
        raise ValueError(f"package {name}: has_prefix_text names files not in the package: {sorted(unknown)}")

    out_dir.mkdir(parents=True, exist_ok=True)
    filename = f"{name}-{version}-{build}.conda"
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=out_dir) as tmp:
        stage = Path(tmp, "stage")
        entries = []
        for rel in sorted(files):
            _check_relpath(name, rel)
            dest = stage / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            _place(files[rel], dest)
            entries.append(_path_entry(rel, dest, rel in prefixed, name))

        info = stage / "info"
        info.mkdir()
        index = {
            "name": name,
            "version": version,
            "build": build,
            "build_number": build_number,
            "depends": list(depends),
            "license": "LicenseRef-test-fixture",
            "subdir": subdir,
            "timestamp": int(time.time() * 1000),
        }
        if noarch is not None:
            index["noarch"] = noarch
        else:
            index["platform"], index["arch"] = _SUBDIR_ARCH[subdir]
        _write_json(info / "index.json", index)
        _write_json(info / "paths.json", {"paths": entries, "paths_version": 1})
        (info / "files").write_text("".join(f"{e['_path']}\n" for e in entries))
        if prefixed:
            (info / "has_prefix").write_text(
                "".join(f"{PREFIX_PLACEHOLDER} text {rel}\n" for rel in sorted(prefixed))
            )
        if noarch == "python":
            _write_json(info / "link.json", {"noarch": {"type": "python"}, "package_metadata_version": 1})
        _write_json(info / "about.json", {"summary": f"{name} (built by tests/support/channel.py)"})

        members = sorted(
            str(p.relative_to(stage)) for p in stage.rglob("*") if not p.is_dir() or p.is_symlink()
        )
        cph.create(str(stage), members, filename, out_folder=tmp, compression_level=compression_level)
        final = out_dir / filename
        os.replace(Path(tmp, filename), final)
    return final


def index_channel(channel_dir: Path) -> None:
    """Write repodata.json for every subdir of ``channel_dir`` (creating the mandatory ``noarch``)."""
    from rattler.index import index_fs

    channel_dir = Path(channel_dir)
    if not channel_dir.is_dir():
        raise FileNotFoundError(f"channel directory {channel_dir} does not exist")
    (channel_dir / "noarch").mkdir(exist_ok=True)
    # A private loop in a worker thread: the caller may already be inside its own event loop.
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, index_fs(channel_dir, force=True, write_shards=False)).result()


def _check_relpath(name: str, rel: str) -> None:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts or p.parts[0] == "info":
        raise ValueError(f"package {name}: bad file path {rel!r} (relative, no '..', not under info/)")


def _place(src: bytes | Path, dest: Path) -> None:
    if isinstance(src, bytes | bytearray):
        dest.write_bytes(src)
        dest.chmod(0o755 if src.startswith(b"#!") else 0o644)
        return
    src = Path(src)
    if src.is_symlink():
        os.symlink(os.readlink(src), dest)
    elif src.is_file():
        try:
            os.link(src, dest)  # same filesystem: no copy of large toolchain trees
        except OSError:
            shutil.copy2(src, dest)
    else:
        raise ValueError(f"{src}: not a file or symlink (directories are added file by file)")


def _path_entry(rel: str, dest: Path, prefixed: bool, name: str) -> dict:
    if dest.is_symlink():
        return {"_path": rel, "path_type": "softlink"}
    data = dest.read_bytes()
    entry = {
        "_path": rel,
        "path_type": "hardlink",
        "sha256": hashlib.sha256(data).hexdigest(),
        "size_in_bytes": len(data),
    }
    if prefixed:
        if PREFIX_PLACEHOLDER.encode() not in data:
            raise ValueError(f"package {name}: {rel} is in has_prefix_text but lacks {PREFIX_PLACEHOLDER}")
        entry["file_mode"] = "text"
        entry["prefix_placeholder"] = PREFIX_PLACEHOLDER
    return entry


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def linux_virtual_packages(glibc: str = "2.35") -> list:
    """The virtual packages of an ubuntu:22.04 x86_64 worker (glibc 2.35), for offline solves."""
    from rattler import BuildString, GenericVirtualPackage, PackageName, Version

    def virtual(name: str, version: str, build: str = "0"):
        return GenericVirtualPackage(PackageName(name), Version(version), BuildString(build))

    return [
        virtual("__unix", "0"),
        virtual("__linux", "5.15"),
        virtual("__glibc", glibc),
        virtual("__archspec", "1", "x86_64"),
    ]


def solve_and_install(
    channel_dir: Path, specs: Iterable[str], prefixes: Iterable[Path], *, cache_dir: Path
) -> list:
    """Solve ``specs`` against the local channel and install the result into each prefix.

    Everything runs in ONE private event loop (py-rattler crashed at interpreter exit when a process
    ran several). Returns the solved records.
    """
    from rattler import Channel, Gateway, install, solve

    channel_url = Path(channel_dir).resolve().as_uri()
    specs, prefixes = list(specs), [Path(p) for p in prefixes]

    async def go():
        gateway = Gateway(cache_dir=Path(cache_dir) / "repodata")
        records = await solve(
            sources=[Channel(channel_url)],
            specs=specs,
            gateway=gateway,
            platforms=["linux-64", "noarch"],
            virtual_packages=linux_virtual_packages(),
        )
        for prefix in prefixes:
            await install(
                records, target_prefix=prefix, cache_dir=Path(cache_dir) / "pkgs", show_progress=False
            )
        return records

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, go()).result()
