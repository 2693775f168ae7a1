"""One-command conda packages repackaged from a Debian .deb, stand-ins for conda-forge's:
`ninja` (the env locks PyPI's, the same binary) from ninja-build: `bin/ninja`; `openssl` from openssl:
`bin/openssl` (it uses the node's libssl3/libcrypto runtime, which workers keep; conda-forge's
carries its own).

`apt-get download` (verified against apt's sha256), `dpkg -x`, packaged with tests/support/channel.py.
Cached per machine in ``~/.cache/lingbot-fixtures/<name>-<deb sha256[:16]>/`` (appears atomically).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .channel import make_package
from .toolchain import default_cache_root


class NinjaBuildError(RuntimeError):
    pass


def _candidate(deb_name: str) -> dict[str, str]:
    proc = subprocess.run(
        ["apt-cache", "show", "--no-all-versions", deb_name], capture_output=True, text=True
    )
    fields = dict(re.findall(r"^([A-Za-z0-9-]+): (.*)$", proc.stdout, flags=re.M))
    if "SHA256" not in fields:
        raise NinjaBuildError(f"apt-cache knows no {deb_name} ({proc.stderr.strip()}); run `apt-get update`")
    return {"version": fields["Version"], "sha256": fields["SHA256"]}


def ninja_package(cache_root: Path | None = None) -> Path:
    """The .conda file of the `ninja` stand-in, built on first use."""
    return command_package("ninja-build", "ninja", "ninja", cache_root)


def openssl_package(cache_root: Path | None = None) -> Path:
    """The .conda file of the `openssl` stand-in (bin/openssl), built on first use."""
    return command_package("openssl", "openssl", "openssl", cache_root)


def command_package(deb_name: str, name: str, command: str, cache_root: Path | None = None) -> Path:
    """The .conda file `name` holding only bin/`command` from Debian's `deb_name`, built on first use."""
    cache_root = Path(cache_root) if cache_root is not None else default_cache_root()
    deb = _candidate(deb_name)
    final = cache_root / f"{name}-{deb['sha256'][:16]}"
    version = deb["version"].split(":")[-1].split("-")[0]  # 1.11.1-2~deb12u1 -> 1.11.1
    built = sorted(final.glob(f"{name}-*.conda"))
    if built:
        return built[0]
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-build-", dir=cache_root))
    try:
        proc = subprocess.run(
            ["apt-get", "download", f"{deb_name}={deb['version']}"], cwd=tmp, capture_output=True, text=True
        )
        debs = sorted(tmp.glob(f"{deb_name}_*.deb"))
        if proc.returncode != 0 or len(debs) != 1:
            raise NinjaBuildError(f"apt-get download {deb_name} failed: {proc.stderr.strip()}")
        if hashlib.sha256(debs[0].read_bytes()).hexdigest() != deb["sha256"]:
            raise NinjaBuildError(f"{debs[0].name}: sha256 differs from apt's index; not using it")
        subprocess.run(["dpkg", "-x", str(debs[0]), str(tmp / "x")], check=True)
        out = tmp / "out"
        make_package(out, name, version, {f"bin/{command}": tmp / "x" / "usr" / "bin" / command})
        (out / "SOURCE").write_text(f"{debs[0].name} sha256 {deb['sha256']}\n")
        try:
            os.rename(out, final)
        except OSError:
            if not sorted(final.glob(f"{name}-*.conda")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(final.glob(f"{name}-*.conda"))[0]
