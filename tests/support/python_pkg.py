"""Real conda packages ``python`` 3.11, ``pip`` and ``setuptools`` built from this machine's CPython.

conda-forge is unreachable here, so the interpreter the tool venv is based on (``sys.base_prefix``,
pyenv's shared-libpython CPython) is repackaged the way conda-forge lays python out:

  python      bin/python3.11 (+ python3, python links), lib/libpython3.11.so*, lib/python3.11
              (the stdlib without test/idlelib/tkinter/ensurepip/lib2to3/turtledemo, the static
              libpython or site-packages), include/python3.11
  setuptools  its files in lib/python3.11/site-packages (the tool venv's, from its RECORD)
  pip         the same for pip; depends on setuptools, so ``--no-build-isolation`` builds work

Relocation: CPython finds its prefix from the executable's location, and the ELF RUNPATHs (pyenv
writes its absolute lib dir) are rewritten in place to ``$ORIGIN``-relative ones, so the env's
python loads the env's libpython, never the build host's. ``_sysconfigdata`` names the prefix
through conda's placeholder, rewritten at install time as conda-forge's python does.

Built once per machine into ``~/.cache/lingbot-fixtures/python-<key>/`` (key = this builder's
source, the interpreter's version and the listing of the files packaged).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import struct
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from .channel import PREFIX_PLACEHOLDER, make_package

LAYOUT_VERSION = "1"
BUILD = "lingbot_0"
PY_MAJOR_MINOR = f"{sys.version_info.major}.{sys.version_info.minor}"
STDLIB = f"lib/python{PY_MAJOR_MINOR}"
SITE_PACKAGES = f"{STDLIB}/site-packages"
# The stdlib's bulk nothing in an env needs (as conda-forge's python, minus its tests and GUI parts).
STDLIB_SKIP_DIRS = {
    "site-packages",
    "test",
    "idlelib",
    "tkinter",
    "ensurepip",
    "lib2to3",
    "turtledemo",
    "__pycache__",
    f"config-{PY_MAJOR_MINOR}-x86_64-linux-gnu",
}
STDLIB_SKIP_PREFIXES = ("_tkinter.", "_test", "xxlimited", "_xxtestfuzz")
SITE_DISTRIBUTIONS = ("setuptools", "pip")  # in dependency order


class PythonBuildError(RuntimeError):
    pass


def default_cache_root() -> Path:
    return Path(os.environ.get("LINGBOT_FIXTURES_CACHE") or Path.home() / ".cache" / "lingbot-fixtures")


def python_packages(cache_root: Path | None = None) -> list[Path]:
    """The .conda files of python, setuptools and pip, built on first use and cached per machine."""
    cache_root = Path(cache_root) if cache_root is not None else default_cache_root()
    source = Path(sys.base_prefix)
    listing = _python_files(source)
    dists = {name: _distribution_files(name) for name in SITE_DISTRIBUTIONS}
    builder = hashlib.sha256(
        Path(__file__).read_bytes() + Path(make_package.__code__.co_filename).read_bytes()
    )
    key_input = {
        "layout": LAYOUT_VERSION, "builder": builder.hexdigest(), "python": sys.version,
        "files": [(rel, _stat_key(p)) for rel, p in sorted(listing.items())],
        "dists": {n: [version, [(rel, _stat_key(p)) for rel, p in sorted(files.items())]]
                  for n, (version, files) in dists.items()},
    }  # fmt: skip
    key = hashlib.sha256(json.dumps(key_input, sort_keys=True).encode()).hexdigest()[:16]
    final = cache_root / f"python-{key}"
    manifest = final / "manifest.json"
    if manifest.is_file():
        return [final / name for name in json.loads(manifest.read_text())["packages"]]

    cache_root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=".python-build-", dir=cache_root))
    try:
        names = [_build_python(source, listing, tmp).name]
        for name in SITE_DISTRIBUTIONS:
            version, files = dists[name]
            depends = [f"python {PY_MAJOR_MINOR}.*"] + (["setuptools"] if name == "pip" else [])
            names.append(make_package(tmp, name, version, files, build=BUILD, depends=depends).name)
        (tmp / "manifest.json").write_text(json.dumps({
            "layout": LAYOUT_VERSION, "python": sys.version, "packages": names,
            "build_seconds": round(time.perf_counter() - start, 2),
        }, indent=1) + "\n")  # fmt: skip
        shutil.rmtree(tmp / "stage", ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:  # another process finished the same build first
            if not manifest.is_file():
                raise
        for stale in cache_root.glob("python-*"):
            if stale != final:
                shutil.rmtree(stale, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [final / name for name in json.loads(manifest.read_text())["packages"]]


def _stat_key(path: Path) -> list[int]:
    st = path.lstat()
    return [st.st_size, st.st_mtime_ns]


def _python_files(source: Path) -> dict[str, Path]:
    """{path in the package: source file} for the interpreter, its shared library, stdlib and headers."""
    exe = f"python{PY_MAJOR_MINOR}"
    if not (source / "bin" / exe).is_file():
        raise PythonBuildError(f"{source}/bin/{exe} not found: sys.base_prefix is not a CPython install")
    files = {f"bin/{exe}": source / "bin" / exe}
    for lib in sorted((source / "lib").glob(f"libpython{PY_MAJOR_MINOR}*.so*")):
        files[f"lib/{lib.name}"] = lib
    for top in (STDLIB, f"include/python{PY_MAJOR_MINOR}"):
        root = source / top
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = Path(dirpath).relative_to(source)
            if rel_dir == Path(STDLIB):
                dirnames[:] = [d for d in dirnames if d not in STDLIB_SKIP_DIRS]
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if rel_dir.name == "lib-dynload" and name.startswith(STDLIB_SKIP_PREFIXES):
                    continue
                files[(rel_dir / name).as_posix()] = Path(dirpath, name)
    return files


def _distribution_files(name: str) -> tuple[str, dict[str, Path]]:
    """The tool venv's installed distribution `name`: its version and files per its RECORD."""
    dist = importlib.metadata.distribution(name)
    site = Path(sysconfig.get_paths()["purelib"])
    files = {}
    for entry in dist.files or []:
        path = Path(dist.locate_file(entry))
        if entry.parts[0] == ".." or "__pycache__" in entry.parts or not path.is_file():
            continue  # console scripts (bin/pip with the venv's shebang) and byte code stay out
        files[f"{SITE_PACKAGES}/{path.relative_to(site).as_posix()}"] = path
    if not files:
        raise PythonBuildError(f"{name}: no files found through its RECORD in {site}")
    return dist.version, files


def _build_python(source: Path, listing: dict[str, Path], work: Path) -> Path:
    stage = work / "stage"
    files: dict[str, bytes | Path] = dict(listing)
    exe = f"python{PY_MAJOR_MINOR}"
    for link in ("python3", "python"):
        (stage / "bin").mkdir(parents=True, exist_ok=True)
        os.symlink(exe, stage / "bin" / link)
        files[f"bin/{link}"] = stage / "bin" / link
    libdir = (source / "lib").as_posix().encode()
    for rel, src in listing.items():
        if src.is_symlink() or not _is_elf(src):
            continue
        data = bytearray(src.read_bytes())
        origin_rel = os.path.relpath("lib", os.path.dirname(rel))
        if _relativize_runpath(data, libdir, f"$ORIGIN/{origin_rel}".encode(), rel):
            # a file, not bytes: make_package keeps a file's mode (bytes become 0o644)
            patched = stage / rel
            patched.parent.mkdir(parents=True, exist_ok=True)
            patched.write_bytes(data)
            patched.chmod(src.stat().st_mode & 0o777)
            files[rel] = patched
    sysconfigdata = [rel for rel in listing if Path(rel).name.startswith("_sysconfigdata_")]
    for rel in sysconfigdata:
        files[rel] = listing[rel].read_bytes().replace(str(source).encode(), PREFIX_PLACEHOLDER.encode())
    return make_package(
        work, "python", sys.version.split()[0], files, build=BUILD, has_prefix_text=sysconfigdata
    )


def _is_elf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def _relativize_runpath(data: bytearray, old: bytes, new: bytes, what: str) -> bool:
    """Rewrite a DT_RUNPATH/DT_RPATH equal to `old` to `new` in place (in .dynstr, NUL padded).

    In place because `new` is never longer: no section has to move, so no patchelf is needed.
    Returns whether anything changed.
    """
    if data[4] != 2 or data[5] != 1:
        raise PythonBuildError(f"{what}: not a 64-bit little-endian ELF file")
    phoff = struct.unpack_from("<Q", data, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1:  # PT_LOAD
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:  # PT_DYNAMIC
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return False
    tags: dict[int, list[int]] = {}
    for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, off)
        if tag == 0:  # DT_NULL
            break
        tags.setdefault(tag, []).append(value)
    paths = tags.get(29, []) + tags.get(15, [])  # DT_RUNPATH, DT_RPATH
    if not paths:
        return False
    strtab = tags[5][0]  # DT_STRTAB, a virtual address
    strtab_off = next((off + strtab - va for va, off, size in loads if va <= strtab < va + size), None)
    if strtab_off is None:
        raise PythonBuildError(f"{what}: DT_STRTAB is in no loaded segment")
    changed = False
    for value in paths:
        start = strtab_off + value
        end = data.index(b"\0", start)
        if bytes(data[start:end]) != old:
            raise PythonBuildError(
                f"{what}: runpath {data[start:end].decode()!r} is not {old.decode()!r}; "
                "a relocated copy would load libraries from the build host"
            )
        data[start:end] = new.ljust(end - start, b"\0")
        changed = True
    return changed
