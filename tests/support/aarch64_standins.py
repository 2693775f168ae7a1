"""linux-aarch64 conda packages for an aarch64 env, stand-ins for conda-forge's (whose aarch64 files this
host cannot download): Debian bookworm arm64 .debs (a private APT_CONFIG with APT::Architecture "arm64",
`apt-get download`, sha256 checked against apt's index, `dpkg-deb -x`) repackaged under conda-forge's
names and layout with tests/support/channel.py:

  sysroot_linux-aarch64 / binutils_impl_linux-aarch64 / gcc_impl_linux-aarch64 / gxx_impl_linux-aarch64
      glibc 2.36 dev files, kernel headers, binutils 2.40, gcc/g++ 12.2 -> $PREFIX/aarch64-conda-linux-gnu/
      sysroot (one tree: Debian's gcc looks its C++ headers up relative to --sysroot), compiler-private
      libraries in .../host-libs, `bin/aarch64-conda-linux-gnu-*` wrappers passing --sysroot
  binutils_linux-aarch64 / gcc_linux-aarch64 / gxx_linux-aarch64
      activate.d/deactivate.d scripts of conda-forge's shape (AR, CC, CXX, ... ; flags as conda-forge's
      aarch64 compiler packages default them)
  python 3.11   Debian's python3.11 (interpreter, stdlib, headers) in conda's layout: bin/python3.11,
                lib/python3.11 (site-packages on sys.path through sitecustomize, sysconfig's default scheme
                posix_prefix, not Debian's posix_local: a one-line patch), include/python3.11 (the
                aarch64 pyconfig.h)
  pip, setuptools   the tool venv's (pure python)
  openssl       bin/openssl (the node's libssl3 runtime, as tests/support/ninja_pkg.py's x86 one)

The aarch64 programs run under qemu (provision/emulation.py); the wrappers and activation scripts are the
x86 stand-in's (tests/support/toolchain.py) with the aarch64 triplet. Known differences from conda-forge:
glibc 2.36 (a worker has 2.35, conda-forge's sysroot 2.17), gcc 12.2 (the lock has 12.4), and python's
extension modules use the node's libssl/libffi/... (a worker's image has them; conda-forge's carries its own).

Built once per machine into ``~/.cache/lingbot-fixtures/aarch64-standins-<key>/`` (key: the .deb
sha256s and this builder's source), appearing atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from . import toolchain as x86
from .channel import make_package
from .python_pkg import SITE_DISTRIBUTIONS, _distribution_files

SUBDIR = "linux-aarch64"
TARGET = "aarch64-conda-linux-gnu"
SYSROOT, HOST_LIBS = f"{TARGET}/sysroot", f"{TARGET}/host-libs"
DEB_TRIPLET = "aarch64-linux-gnu"
BUILD = "debian12_arm64_0"
TOOLCHAIN_DEBS = {
    **{d: p.replace("linux-64", "linux-aarch64") for d, p in x86.DEBS.items() if d != "libquadmath0"},
    "binutils-aarch64-linux-gnu": "binutils_impl_linux-aarch64",
}
TOOLCHAIN_DEBS.pop("binutils-x86-64-linux-gnu")
PYTHON_DEBS = ("python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib", "libpython3.11-dev")
OPENSSL_DEB = "openssl"
TRIM = tuple(p.replace("x86_64-linux-gnu", DEB_TRIPLET) for p in x86.TRIM_PATTERNS)
STDLIB_SKIP = (
    "EXTERNALLY-MANAGED",
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "lib2to3",
    "__pycache__",
    "dist-packages",
)
# Debian's python -> conda's layout (each patch must apply exactly once)
PY_PATCHES = {
    "lib/python3.11/sysconfig.py": (
        "        else:\n            prefix_scheme = 'posix_local'\n",
        "        else:\n            prefix_scheme = 'posix_prefix'  # conda layout\n",
    ),
}
# Debian's site module is frozen into the interpreter (3.11): site-packages is added here instead
SITECUSTOMIZE = (
    '"""lingbot stand-in: conda\'s layout, lib/python3.11/site-packages on sys.path\n'
    '(Debian\'s frozen site adds only dist-packages)."""\nimport os, site, sys\n\n'
    'site.addsitedir(os.path.join(sys.prefix, "lib", "python3.11", "site-packages"))\n'
)


class StandinBuildError(RuntimeError):
    pass


def _apt_env(cache_root: Path) -> dict[str, str]:
    from provision.emulation import _arm64_apt

    return _arm64_apt(cache_root / "emulation")


def _resolve(names: list[str], env: dict[str, str]) -> dict[str, dict[str, str]]:
    proc = subprocess.run(
        ["apt-cache", "show", "--no-all-versions", *names], env=env, capture_output=True, text=True
    )
    found: dict[str, dict[str, str]] = {}
    for stanza in proc.stdout.split("\n\n"):
        f = dict(re.findall(r"^([A-Za-z0-9-]+): (.*)$", stanza, flags=re.M))
        if f.get("Package") in names and f.get("Architecture") in ("arm64", "all"):
            found.setdefault(f["Package"], {"version": f["Version"], "sha256": f["SHA256"]})
    missing = sorted(set(names) - set(found))
    if missing:
        raise StandinBuildError(f"apt (arm64) knows no candidate for {missing}: {proc.stderr.strip()[-300:]}")
    return found


def _download(debs: dict[str, dict[str, str]], deb_dir: Path, env: dict[str, str]) -> dict[str, Path]:
    """The .debs not yet cached, in one `apt-get download` call (pipelined), each checked against apt's
    sha256 before it is kept."""
    deb_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: deb_dir / f"{name}_{meta['sha256'][:16]}_arm64.deb" for name, meta in debs.items()}
    wanted = sorted(n for n, p in paths.items() if not (p.is_file() and x86._sha256(p) == debs[n]["sha256"]))
    if not wanted:
        return paths
    with tempfile.TemporaryDirectory(dir=deb_dir) as tmp:
        proc = subprocess.run(["apt-get", "download", *(f"{n}={debs[n]['version']}" for n in wanted)],
                              cwd=tmp, env=env, capture_output=True, text=True)  # fmt: skip
        if proc.returncode != 0:
            raise StandinBuildError(f"apt-get download (arm64) of {' '.join(wanted)}: {proc.stderr.strip()}")
        for name in wanted:
            got = sorted(Path(tmp).glob(f"{name}_*.deb"))
            if len(got) != 1:
                raise StandinBuildError(f"apt-get download {name} (arm64) left {len(got)} files, not one")
            if x86._sha256(got[0]) != debs[name]["sha256"]:
                raise StandinBuildError(f"{got[0].name}: sha256 differs from apt's index; not using it")
            os.replace(got[0], paths[name])
    return paths


def _extract(deb: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
    return dest


def standin_packages(cache_root: Path | None = None) -> list[Path]:
    """The .conda files (toolchain, python, pip, setuptools, openssl) for linux-aarch64, built once."""
    cache_root = Path(cache_root) if cache_root is not None else x86.default_cache_root()
    env = _apt_env(cache_root)
    names = sorted({*TOOLCHAIN_DEBS, *PYTHON_DEBS, OPENSSL_DEB})
    debs = _resolve(names, env)
    builder = hashlib.sha256(Path(__file__).read_bytes() + Path(x86.__file__).read_bytes()).hexdigest()
    key = hashlib.sha256(json.dumps({"debs": debs, "builder": builder}, sort_keys=True).encode()).hexdigest()
    final = cache_root / f"aarch64-standins-{key[:16]}"
    manifest = final / "manifest.json"
    if manifest.is_file():
        return [final / n for n in json.loads(manifest.read_text())["packages"]]
    files = _download(debs, cache_root / "debs-arm64", env)
    tmp = Path(tempfile.mkdtemp(prefix=".aarch64-standins-", dir=cache_root))
    try:
        stage = tmp / "stage"
        out = [p.name for p in _toolchain(files, stage, tmp)]
        out.append(_python(files, stage, tmp).name)
        for name in SITE_DISTRIBUTIONS:
            version, dist = _distribution_files(name)
            deps = ["python 3.11.*"] + (["setuptools"] if name == "pip" else [])
            out.append(make_package(tmp, name, version, dist, build=BUILD, depends=deps, subdir=SUBDIR).name)
        ssl = _extract(files[OPENSSL_DEB], stage / "openssl")
        version = debs[OPENSSL_DEB]["version"].split("-")[0]
        out.append(make_package(tmp, "openssl", version, {"bin/openssl": ssl / "usr/bin/openssl"},
                                build=BUILD, subdir=SUBDIR).name)  # fmt: skip
        manifest_tmp = tmp / "manifest.json"
        manifest_tmp.write_text(json.dumps({"debs": debs, "packages": out}, indent=1) + "\n")
        shutil.rmtree(stage)
        try:
            os.rename(tmp, final)
        except OSError:
            if not manifest.is_file():
                raise
        for stale in cache_root.glob("aarch64-standins-*"):  # older builder sources: ~60 MB each
            if stale != final:
                shutil.rmtree(stale, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [final / n for n in json.loads(manifest.read_text())["packages"]]


def _toolchain(files: dict[str, Path], stage: Path, out: Path) -> list[Path]:
    content: dict[str, dict[str, bytes | Path]] = {pkg: {} for pkg in set(TOOLCHAIN_DEBS.values())}
    for deb, pkg in sorted(TOOLCHAIN_DEBS.items()):
        root = _extract(files[deb], stage / deb)
        for pattern in TRIM:
            for path in root.glob(pattern):
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        x86._relativize_symlinks(root)
        for item in sorted(root.rglob("*")):
            if item.is_dir() and not item.is_symlink():
                continue
            private = deb in x86.PRIVATE_LIB_DEBS and ".so" in item.name
            content[pkg][f"{HOST_LIBS}/{item.name}" if private else f"{SYSROOT}/{item.relative_to(root)}"] = (
                item
            )

    def wrap(cmd: str, tool: str, flag: bool) -> bytes:
        return x86._WRAPPER.format(command=f"{TARGET}-{cmd}", tool=tool, sysroot=SYSROOT, host_libs=HOST_LIBS,
                                   sysroot_flag=' --sysroot="$sysroot"' if flag else "").encode()  # fmt: skip

    content["binutils_impl_linux-aarch64"].update(
        {f"bin/{TARGET}-{t}": wrap(t, f"usr/bin/{DEB_TRIPLET}-{t}", t == "ld") for t in x86.BINUTILS_TOOLS}
    )
    content["gcc_impl_linux-aarch64"].update(
        {f"bin/{TARGET}-{c}": wrap(c, t, f) for c, (t, f) in x86.GCC_WRAPPERS.items()}
    )
    content["gxx_impl_linux-aarch64"].update(
        {f"bin/{TARGET}-{c}": wrap(c, t, f) for c, (t, f) in x86.GXX_WRAPPERS.items()}
    )
    for pkg, (programs, values) in _activation_values().items():
        content[pkg] = _activation(pkg, programs, values)
    g, b = f"{x86.GCC_VERSION}.*", f"{x86.BINUTILS_VERSION}.*"
    specs = {
        "sysroot_linux-aarch64": (x86.GLIBC_VERSION, []),
        "binutils_impl_linux-aarch64": (x86.BINUTILS_VERSION, ["sysroot_linux-aarch64"]),
        "binutils_linux-aarch64": (x86.BINUTILS_VERSION, [f"binutils_impl_linux-aarch64 {b}"]),
        "gcc_impl_linux-aarch64": (x86.GCC_VERSION, ["binutils_impl_linux-aarch64",
                                                     "sysroot_linux-aarch64"]),
        "gcc_linux-aarch64": (x86.GCC_VERSION, [f"binutils_linux-aarch64 {b}",
                                                f"gcc_impl_linux-aarch64 {g}"]),
        "gxx_impl_linux-aarch64": (x86.GCC_VERSION, [f"gcc_impl_linux-aarch64 {x86.GCC_VERSION}"]),
        "gxx_linux-aarch64": (x86.GCC_VERSION, [f"gcc_linux-aarch64 {x86.GCC_VERSION}",
                                                f"gxx_impl_linux-aarch64 {g}"]),
    }  # fmt: skip
    return [
        make_package(out, n, v, content[n], build=BUILD, depends=d, subdir=SUBDIR)
        for n, (v, d) in specs.items()
    ]


def _activation_values() -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """x86's ACTIVATION with the aarch64 triplet and conda-forge's aarch64 default flags."""
    out = {}
    for pkg, (programs, values) in x86.ACTIVATION.items():
        vals = {}
        for k, v in values.items():
            v = v.replace(x86.TARGET, TARGET).replace(x86.SYSROOT, SYSROOT)
            v = v.replace("-march=nocona -mtune=haswell -ftree-vectorize", "-ftree-vectorize")
            vals[k] = v.replace("x86_64_conda_cos7_linux_gnu", "aarch64_conda_cos7_linux_gnu")
        out[pkg.replace("linux-64", "linux-aarch64")] = (programs, vals)
    return out


def _activation(package: str, programs: dict[str, str], values: dict[str, str]) -> dict[str, bytes | Path]:
    sets = [f'  _standin_set {var} "${{CONDA_PREFIX}}/bin/{TARGET}-{cmd}"' for var, cmd in programs.items()]
    sets += [f'  _standin_set {var} "{value}"' for var, value in values.items()]
    on = (x86._ACTIVATE.replace("@PACKAGE@", package).replace("@WHAT@", ", ".join(programs))
          .replace("@TOOLS@", " ".join(programs.values())).replace("@TARGET@", TARGET)
          .replace("@BODY@", "\n".join(sets)))  # fmt: skip
    off = x86._DEACTIVATE.replace("@PACKAGE@", package).replace(
        "@BODY@", "\n".join(f"_standin_restore {var}" for var in [*programs, *values])
    )
    return {
        f"etc/conda/activate.d/activate-{package}.sh": on.encode(),
        f"etc/conda/deactivate.d/deactivate-{package}.sh": off.encode(),
    }


def _python(files: dict[str, Path], stage: Path, out: Path) -> Path:
    roots = [_extract(files[d], stage / d) for d in PYTHON_DEBS]
    content: dict[str, bytes | Path] = {}
    for root in roots:
        exe = root / "usr/bin/python3.11"
        if exe.is_file() and not exe.is_symlink():
            content["bin/python3.11"] = exe
        lib = root / "usr/lib/python3.11"
        for item in sorted(lib.rglob("*")) if lib.is_dir() else []:
            rel = item.relative_to(lib)
            if (
                rel.parts[0] in STDLIB_SKIP
                or "__pycache__" in rel.parts
                or (item.is_dir() and not item.is_symlink())
            ):
                continue
            content[f"lib/python3.11/{rel}"] = item
        inc = root / "usr/include/python3.11"
        for item in sorted(inc.rglob("*")) if inc.is_dir() else []:
            if item.is_file():
                content[f"include/python3.11/{item.relative_to(inc)}"] = item
        real = root / f"usr/include/{DEB_TRIPLET}/python3.11/pyconfig.h"
        if real.is_file():
            content["include/python3.11/pyconfig.h"] = real  # Debian's is a multiarch dispatcher
    content["lib/python3.11/sitecustomize.py"] = SITECUSTOMIZE.encode()
    for rel, (old, new) in PY_PATCHES.items():
        text = Path(content[rel]).read_text()
        if text.count(old) != 1:
            raise StandinBuildError(f"{rel}: the conda-layout patch does not apply (Debian's python changed)")
        content[rel] = text.replace(old, new).encode()
    found = re.search(rb"3\.11\.\d+", Path(content["bin/python3.11"]).read_bytes())
    version = found.group().decode() if found else "3.11.2"
    links = stage / "python-links"
    links.mkdir()
    for name in ("python3", "python"):
        (links / name).symlink_to("python3.11")
        content[f"bin/{name}"] = links / name
    return make_package(out, "python", version, content, build=BUILD, subdir=SUBDIR)
