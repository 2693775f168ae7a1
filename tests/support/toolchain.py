"""A relocatable C/C++ toolchain packaged as conda packages: a stand-in for conda-forge's compilers.

conda-forge is unreachable here, so Debian bookworm's gcc-12/g++-12/binutils and glibc's dev files
(``apt-get download``, ``dpkg -x``) are repackaged under the names conda-forge uses:

  sysroot_linux-64        glibc, kernel headers, libcrypt    -> $PREFIX/x86_64-conda-linux-gnu/sysroot
  binutils_impl_linux-64  as, ld, ar, ...                    -> same tree (+ their libs in host-libs/)
  gcc_impl_linux-64       gcc-12, cc1, libgcc, libgomp       -> same tree (+ isl/mpc/mpfr in host-libs/)
  gxx_impl_linux-64       g++-12, cc1plus, libstdc++ headers -> same tree
  binutils_linux-64       bin/x86_64-conda-linux-gnu-{ld,as,ar,nm,...}
  gcc_linux-64            bin/x86_64-conda-linux-gnu-{cc,gcc,cpp} + activate.d (CC, CPP, ...)
  gxx_linux-64            bin/x86_64-conda-linux-gnu-{c++,g++} + activate.d (CXX)

The compiler lives inside the sysroot tree because Debian's gcc is configured ``--with-sysroot=/``:
its C++ headers are looked up relative to ``--sysroot``, so one tree keeps them consistent. The
``bin/`` wrappers find their prefix at run time, pass ``--sysroot`` and give the compiler process
(only) the private library dir and binutils on its paths, the way conda-forge's rpaths do.

Known difference from conda-forge: the binaries need the build host's glibc (2.36), not 2.17.

Built once per machine into ``~/.cache/lingbot-fixtures/toolchain-<key>/`` (key = the .deb
sha256s and this builder's layout version); the .debs are kept in ``.../debs/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .channel import make_package

LAYOUT_VERSION = "1"  # format of the cache entry (its manifest.json)
TARGET = "x86_64-conda-linux-gnu"
SYSROOT = f"{TARGET}/sysroot"
HOST_LIBS = f"{TARGET}/host-libs"  # compiler-private shared libraries, never on the link path
GCC_VERSION, BINUTILS_VERSION, GLIBC_VERSION = "12.2.0", "2.40", "2.36"
BUILD = "debian12_0"

# Debian package -> conda package. Packages mapped to None are the compiler's private libraries.
DEBS: dict[str, str] = {
    "libc6": "sysroot_linux-64",
    "libc6-dev": "sysroot_linux-64",
    "linux-libc-dev": "sysroot_linux-64",
    "libcrypt-dev": "sysroot_linux-64",
    "libcrypt1": "sysroot_linux-64",
    "binutils": "binutils_impl_linux-64",
    "binutils-common": "binutils_impl_linux-64",
    "binutils-x86-64-linux-gnu": "binutils_impl_linux-64",
    "libbinutils": "binutils_impl_linux-64",
    "libctf0": "binutils_impl_linux-64",
    "libctf-nobfd0": "binutils_impl_linux-64",
    "libjansson4": "binutils_impl_linux-64",
    "gcc-12": "gcc_impl_linux-64",
    "cpp-12": "gcc_impl_linux-64",
    "libgcc-12-dev": "gcc_impl_linux-64",
    "libgcc-s1": "gcc_impl_linux-64",
    "libgomp1": "gcc_impl_linux-64",
    "libatomic1": "gcc_impl_linux-64",
    "libitm1": "gcc_impl_linux-64",
    "libquadmath0": "gcc_impl_linux-64",
    "libisl23": "gcc_impl_linux-64",
    "libmpc3": "gcc_impl_linux-64",
    "libmpfr6": "gcc_impl_linux-64",
    "g++-12": "gxx_impl_linux-64",
    "libstdc++-12-dev": "gxx_impl_linux-64",
    "libstdc++6": "gxx_impl_linux-64",
}
# Debian packages whose shared libraries only the compiler/binutils processes load.
PRIVATE_LIB_DEBS = {
    "libbinutils",
    "libctf0",
    "libctf-nobfd0",
    "libjansson4",
    "libisl23",
    "libmpc3",
    "libmpfr6",
}

# Dropped from the trees: docs, and tools nothing here runs (LTO compiler, gold, sanitizer archives).
TRIM_PATTERNS = (
    "usr/share/*",
    "usr/bin/*lto-dump*",
    "usr/libexec/gcc/x86_64-linux-gnu/12/lto1",
    "usr/bin/*ld.gold",
    "usr/bin/*gold",
    "usr/bin/*gprofng*",
    "usr/bin/*gp-*",
    "usr/lib/gcc/x86_64-linux-gnu/12/plugin/*",
    "usr/lib/gcc/x86_64-linux-gnu/12/lib*san*",
    "usr/lib/gcc/x86_64-linux-gnu/12/libhwasan*",
    "etc/*",
)

# Wrappers: command suffix -> (tool inside the tree, relative to SYSROOT, takes --sysroot)
GCC_WRAPPERS = {
    "cc": ("usr/bin/gcc-12", True),
    "gcc": ("usr/bin/gcc-12", True),
    "cpp": ("usr/bin/cpp-12", True),
    "gcc-ar": ("usr/bin/gcc-ar-12", False),
    "gcc-nm": ("usr/bin/gcc-nm-12", False),
    "gcc-ranlib": ("usr/bin/gcc-ranlib-12", False),
}
GXX_WRAPPERS = {"c++": ("usr/bin/g++-12", True), "g++": ("usr/bin/g++-12", True)}
BINUTILS_TOOLS = ("addr2line", "ar", "as", "c++filt", "elfedit", "ld", "ld.bfd", "nm", "objcopy",
                  "objdump", "ranlib", "readelf", "size", "strings", "strip")  # fmt: skip

_WRAPPER = """#!/bin/sh
# {command}: relocatable wrapper from the lingbot toolchain stand-in ({tool}).
# The prefix is found from this script's own location, so the env works wherever it is installed.
self=$(readlink -f -- "$0") || exit 127
prefix=${{self%/bin/*}}
sysroot="$prefix/{sysroot}"
# Only the compiler's own processes (cc1, as, ld, collect2) see these; programs built do not.
PATH="$sysroot/usr/bin:$PATH"
LD_LIBRARY_PATH="$prefix/{host_libs}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"
export PATH LD_LIBRARY_PATH
exec "$sysroot/{tool}"{sysroot_flag} "$@"
"""

# activate.d/deactivate.d in the shape of conda-forge's compiler activation packages (gcc_linux-64 & co.,
# from ctng-compiler-activation): sourced by bash/zsh/sh; tools by absolute path (all present, or nothing
# is set), flags only where the caller has none (`${CFLAGS:-...}`), HOST/BUILD/sysroot/aliases, and each
# previous non-empty value kept in CONDA_BACKUP_<NAME> for deactivation. Written for this stand-in.
_ACTIVATE = """# shellcheck shell=sh
# @PACKAGE@ (lingbot toolchain stand-in): the env's @WHAT@ for an activated shell.
_standin_set() {  # NAME VALUE: keep NAME's value in CONDA_BACKUP_NAME, then set it (empty VALUE: unset)
  eval "_standin_old=\\${$1:-}"
  if [ -n "$_standin_old" ]; then eval "export CONDA_BACKUP_$1=\\"\\$_standin_old\\""
  else unset "CONDA_BACKUP_$1"; fi
  if [ -n "$2" ]; then eval "export $1=\\"\\$2\\""; else unset "$1"; fi
}
_standin_missing=""
for _standin_tool in @TOOLS@; do
  [ -x "${CONDA_PREFIX}/bin/@TARGET@-${_standin_tool}" ] ||
    _standin_missing="${_standin_missing} ${_standin_tool}"
done
if [ -n "${_standin_missing}" ]; then
  echo "ERROR: @PACKAGE@: ${CONDA_PREFIX}/bin has no @TARGET@- program for${_standin_missing}; nothing set"
else
@BODY@
fi
unset -f _standin_set
unset _standin_old _standin_missing _standin_tool
"""

_DEACTIVATE = """# shellcheck shell=sh
# @PACKAGE@ (lingbot toolchain stand-in): undo its activate.d script.
_standin_restore() {  # NAME: back to CONDA_BACKUP_NAME's value, or unset when there was none
  eval "_standin_old=\\${CONDA_BACKUP_$1:-}"
  if [ -n "$_standin_old" ]; then eval "export $1=\\"\\$_standin_old\\""; else unset "$1"; fi
  unset "CONDA_BACKUP_$1"
}
@BODY@
unset -f _standin_restore
unset _standin_old
"""
# Flags as conda-forge's linux-64 compiler packages default them (when the caller has none).
_CPPFLAGS = "-DNDEBUG -D_FORTIFY_SOURCE=2 -O2 -isystem ${CONDA_PREFIX}/include"
_CFLAGS = ("-march=nocona -mtune=haswell -ftree-vectorize -fPIC -fstack-protector-strong -fno-plt -O2 "
           "-ffunction-sections -pipe -isystem ${CONDA_PREFIX}/include")  # fmt: skip
_CXXFLAGS = _CFLAGS.replace(
    " -isystem", " -std=c++17 -fmessage-length=0 -fvisibility-inlines-hidden -isystem"
)
_LDFLAGS = ("-Wl,-O2 -Wl,--sort-common -Wl,--as-needed -Wl,-z,relro -Wl,-z,now -Wl,--disable-new-dtags "
            "-Wl,--gc-sections -Wl,--allow-shlib-undefined -Wl,-rpath,${CONDA_PREFIX}/lib "
            "-Wl,-rpath-link,${CONDA_PREFIX}/lib -L${CONDA_PREFIX}/lib")  # fmt: skip
# package -> (programs: variable -> command suffix, other variables: name -> value; "" unsets it)
ACTIVATION: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "binutils_linux-64": (
        {"ADDR2LINE": "addr2line", "AR": "ar", "AS": "as", "CXXFILT": "c++filt", "ELFEDIT": "elfedit",
         "LD": "ld", "NM": "nm", "OBJCOPY": "objcopy", "OBJDUMP": "objdump", "RANLIB": "ranlib",
         "READELF": "readelf", "SIZE": "size", "STRINGS": "strings", "STRIP": "strip"},
        {"HOST": TARGET},
    ),
    "gcc_linux-64": (
        {"CC": "cc", "CPP": "cpp", "GCC": "gcc", "GCC_AR": "gcc-ar", "GCC_NM": "gcc-nm",
         "GCC_RANLIB": "gcc-ranlib"},
        {"HOST": TARGET, "BUILD": TARGET, "CPPFLAGS": "${CPPFLAGS:-" + _CPPFLAGS + "}",
         "CFLAGS": "${CFLAGS:-" + _CFLAGS + "}", "LDFLAGS": "${LDFLAGS:-" + _LDFLAGS + "}",
         "DEBUG_CFLAGS": "${DEBUG_CFLAGS:-" + _CFLAGS.replace("-O2", "-Og -g") + "}",
         "CMAKE_PREFIX_PATH": "${CONDA_PREFIX}:${CONDA_PREFIX}/" + SYSROOT + "/usr",
         "_CONDA_PYTHON_SYSCONFIGDATA_NAME": "${_CONDA_PYTHON_SYSCONFIGDATA_NAME:-"
                                             "_sysconfigdata_x86_64_conda_cos7_linux_gnu}",
         "CONDA_BUILD_SYSROOT": "${CONDA_PREFIX}/" + SYSROOT, "CONDA_BUILD_CROSS_COMPILATION": "",
         "CC_FOR_BUILD": "${CONDA_PREFIX}/bin/" + TARGET + "-cc",
         "build_alias": TARGET, "host_alias": TARGET},
    ),
    "gxx_linux-64": (
        {"CXX": "c++", "GXX": "g++"},
        {"CXXFLAGS": "${CXXFLAGS:-" + _CXXFLAGS + "}",
         "DEBUG_CXXFLAGS": "${DEBUG_CXXFLAGS:-" + _CXXFLAGS.replace("-O2", "-Og -g") + "}",
         "CXX_FOR_BUILD": "${CONDA_PREFIX}/bin/" + TARGET + "-c++"},
    ),
}  # fmt: skip
# conda-forge's native-name and meta packages: name -> (depends, bin/ symlink -> target in bin/)
NATIVE: dict[str, tuple[list[str], dict[str, str]]] = {
    "gcc": ([f"gcc_impl_linux-64 {GCC_VERSION}.*"], {n: f"{TARGET}-{n}" for n in ("cc", "gcc", "cpp")}),
    "gxx": ([f"gxx_impl_linux-64 {GCC_VERSION}.*", f"gcc {GCC_VERSION}.*"],
            {n: f"{TARGET}-{n}" for n in ("c++", "g++")}),
    "c-compiler": (["gcc", "gcc_linux-64"], {}),
    "cxx-compiler": (["c-compiler", "gxx", "gxx_linux-64"], {}),
    "compilers": (["c-compiler", "cxx-compiler"], {}),
}  # fmt: skip


class ToolchainBuildError(RuntimeError):
    pass


def default_cache_root() -> Path:
    return Path(os.environ.get("LINGBOT_FIXTURES_CACHE") or Path.home() / ".cache" / "lingbot-fixtures")


def toolchain_packages(cache_root: Path | None = None) -> list[Path]:
    """The toolchain stand-in's .conda files, built on first use and cached per machine."""
    cache_root = Path(cache_root) if cache_root is not None else default_cache_root()
    debs = resolve_debs()
    # The builder's own source is part of the key: editing the layout or a wrapper rebuilds.
    builder = hashlib.sha256(
        Path(__file__).read_bytes() + Path(make_package.__code__.co_filename).read_bytes()
    )
    key = hashlib.sha256(
        json.dumps(
            {"layout": LAYOUT_VERSION, "debs": debs, "builder": builder.hexdigest()}, sort_keys=True
        ).encode()
    ).hexdigest()[:16]
    final = cache_root / f"toolchain-{key}"
    manifest = final / "manifest.json"
    if manifest.is_file():
        return [final / name for name in json.loads(manifest.read_text())["packages"]]

    cache_root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    deb_files = download_debs(debs, cache_root / "debs")
    tmp = Path(tempfile.mkdtemp(prefix=".toolchain-build-", dir=cache_root))
    try:
        names = _build_packages(deb_files, tmp)
        (tmp / "manifest.json").write_text(json.dumps({
            "layout": LAYOUT_VERSION, "debs": debs, "packages": names,
            "build_seconds": round(time.perf_counter() - start, 2),
        }, indent=1) + "\n")  # fmt: skip
        shutil.rmtree(tmp / "stage")
        try:
            os.rename(tmp, final)
        except OSError:
            if not manifest.is_file():
                raise
        for stale in cache_root.glob("toolchain-*"):  # builds by older builder sources: ~60 MB each
            if stale != final:
                shutil.rmtree(stale, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [final / name for name in json.loads(manifest.read_text())["packages"]]


def resolve_debs() -> dict[str, dict[str, str]]:
    """{deb name: {"version", "sha256", "filename"}} for the candidates apt knows (no download).

    A fresh machine may have no package lists yet: as root, `apt-get update` once and retry.
    """
    try:
        return _resolve_debs()
    except ToolchainBuildError:
        if os.geteuid() != 0:
            raise
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True)
        return _resolve_debs()


def _resolve_debs() -> dict[str, dict[str, str]]:
    proc = subprocess.run(
        ["apt-cache", "show", "--no-all-versions", *sorted(DEBS)], capture_output=True, text=True
    )
    found: dict[str, dict[str, str]] = {}
    for stanza in proc.stdout.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z0-9-]+): (.*)$", stanza, flags=re.M))
        if fields.get("Package") in DEBS and fields.get("Architecture") in ("amd64", "all"):
            found.setdefault(fields["Package"], {
                "version": fields["Version"], "sha256": fields["SHA256"],
                "filename": fields["Filename"].rsplit("/", 1)[-1],
            })  # fmt: skip
    missing = sorted(set(DEBS) - set(found))
    if missing:
        raise ToolchainBuildError(
            f"apt-cache knows no candidate for {missing} ({proc.stderr.strip() or 'empty package lists'}); "
            "run `apt-get update` on this Debian bookworm machine"
        )
    return found


def download_debs(debs: dict[str, dict[str, str]], deb_dir: Path) -> dict[str, Path]:
    """Fetch the .debs with one `apt-get download` (kept across builds) and verify their sha256."""
    deb_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: deb_dir / meta["filename"] for name, meta in debs.items()}
    wanted = sorted(n for n, p in paths.items() if not (p.is_file() and _sha256(p) == debs[n]["sha256"]))
    if wanted:
        with tempfile.TemporaryDirectory(dir=deb_dir) as tmp:
            proc = subprocess.run(
                ["apt-get", "download", *(f"{n}={debs[n]['version']}" for n in wanted)],
                cwd=tmp, capture_output=True, text=True,
            )  # fmt: skip
            if proc.returncode != 0:
                raise ToolchainBuildError(
                    f"apt-get download {' '.join(wanted)} failed: {proc.stderr.strip()}"
                )
            for name in wanted:
                found = sorted(Path(tmp).glob(f"{name}_*.deb"))  # <pkg>_<epoch%3aversion>_<arch>.deb
                if len(found) != 1:
                    raise ToolchainBuildError(f"apt-get download left {found or 'no file'} for {name}")
                got = found[0]
                if _sha256(got) != debs[name]["sha256"]:
                    raise ToolchainBuildError(f"{got.name}: sha256 differs from apt's index; not using it")
                os.replace(got, paths[name])
    return paths


def _build_packages(deb_files: dict[str, Path], work: Path) -> list[str]:
    stage = work / "stage"
    files: dict[str, dict[str, Path]] = {pkg: {} for pkg in set(DEBS.values())}
    for deb, path in sorted(deb_files.items()):
        root = stage / deb
        root.mkdir(parents=True)
        subprocess.run(["dpkg-deb", "-x", str(path), str(root)], check=True)
        _trim(root)
        _relativize_symlinks(root)
        for item in sorted(root.rglob("*")):
            if item.is_dir() and not item.is_symlink():
                continue
            rel = item.relative_to(root).as_posix()
            if deb in PRIVATE_LIB_DEBS and ".so" in item.name:
                dest = f"{HOST_LIBS}/{item.name}"
            else:
                dest = f"{SYSROOT}/{rel}"
            files[DEBS[deb]][dest] = item

    # as on conda-forge: the *_impl packages hold the <triplet>-* programs, the *_linux-64 ones only
    # their activation scripts, `gcc`/`gxx` the native names (symlinks), the rest is metadata
    files["binutils_impl_linux-64"].update({
        f"bin/{TARGET}-{tool}": _wrapper(f"{TARGET}-{tool}", f"usr/bin/x86_64-linux-gnu-{tool}", tool == "ld")
        for tool in BINUTILS_TOOLS
    })  # fmt: skip
    files["gcc_impl_linux-64"].update({
        f"bin/{TARGET}-{cmd}": _wrapper(f"{TARGET}-{cmd}", tool, flag)
        for cmd, (tool, flag) in GCC_WRAPPERS.items()
    })  # fmt: skip
    files["gxx_impl_linux-64"].update({
        f"bin/{TARGET}-{cmd}": _wrapper(f"{TARGET}-{cmd}", tool, flag)
        for cmd, (tool, flag) in GXX_WRAPPERS.items()
    })  # fmt: skip
    for package, (programs, values) in ACTIVATION.items():
        files[package] = _activation(package, programs, values)
    links = work / "links"
    links.mkdir()
    for package, (_, symlinks) in NATIVE.items():
        files[package] = {
            f"share/lingbot-standin/{package}.txt": f"{package}: a stand-in metapackage\n".encode()
        }
        for name, target in symlinks.items():
            (links / name).symlink_to(target)
            files[package][f"bin/{name}"] = links / name

    gcc_pin, bin_pin = f"{GCC_VERSION}.*", f"{BINUTILS_VERSION}.*"
    specs = {  # name: (version, depends) -- the dependency shape of conda-forge's compiler packages
        "sysroot_linux-64": (GLIBC_VERSION, []),
        "binutils_impl_linux-64": (BINUTILS_VERSION, ["sysroot_linux-64"]),
        "binutils_linux-64": (BINUTILS_VERSION, [f"binutils_impl_linux-64 {bin_pin}", "sysroot_linux-64"]),
        "gcc_impl_linux-64": (
            GCC_VERSION,
            [f"binutils_impl_linux-64 >={BINUTILS_VERSION}", "sysroot_linux-64"],
        ),
        "gcc_linux-64": (GCC_VERSION, [f"binutils_linux-64 {bin_pin}", f"gcc_impl_linux-64 {gcc_pin}",
                                       "sysroot_linux-64"]),
        "gxx_impl_linux-64": (GCC_VERSION, [f"gcc_impl_linux-64 {GCC_VERSION}", "sysroot_linux-64"]),
        "gxx_linux-64": (GCC_VERSION, [f"gcc_linux-64 {GCC_VERSION}", f"gxx_impl_linux-64 {gcc_pin}",
                                       "sysroot_linux-64"]),
    }  # fmt: skip
    specs.update({name: (GCC_VERSION, depends) for name, (depends, _) in NATIVE.items()})
    names = []
    for name, (version, depends) in specs.items():
        pkg = make_package(work, name, version, files[name], build=BUILD, depends=depends)
        names.append(pkg.name)
    return names


def _trim(root: Path) -> None:
    for pattern in TRIM_PATTERNS:
        for path in root.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


def _relativize_symlinks(root: Path) -> None:
    """Absolute links (e.g. lib64/ld-linux-x86-64.so.2 -> /lib/...) would point at the host: "
    "make them relative."""
    for link in root.rglob("*"):
        if link.is_symlink() and os.readlink(link).startswith("/"):
            target = root / os.readlink(link).lstrip("/")
            link.unlink()
            link.symlink_to(os.path.relpath(target, link.parent))


def _wrapper(command: str, tool: str, takes_sysroot: bool) -> bytes:
    return _WRAPPER.format(
        command=command, tool=tool, sysroot=SYSROOT, host_libs=HOST_LIBS,
        sysroot_flag=' --sysroot="$sysroot"' if takes_sysroot else "",
    ).encode()  # fmt: skip


def _activation(package: str, programs: dict[str, str], values: dict[str, str]) -> dict[str, bytes]:
    """activate.d/deactivate.d scripts for `package` (see _ACTIVATE): programs first, then the values."""
    sets = [f'  _standin_set {var} "${{CONDA_PREFIX}}/bin/{TARGET}-{cmd}"' for var, cmd in programs.items()]
    sets += [f'  _standin_set {var} "{value}"' for var, value in values.items()]
    on = (_ACTIVATE.replace("@PACKAGE@", package).replace("@WHAT@", ", ".join(programs))
          .replace("@TOOLS@", " ".join(programs.values())).replace("@TARGET@", TARGET)
          .replace("@BODY@", "\n".join(sets)))  # fmt: skip
    off = _DEACTIVATE.replace("@PACKAGE@", package).replace(
        "@BODY@", "\n".join(f"_standin_restore {var}" for var in [*programs, *values])
    )
    return {
        f"etc/conda/activate.d/activate-{package}.sh": on.encode(),
        f"etc/conda/deactivate.d/deactivate-{package}.sh": off.encode(),
    }


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
