"""A `ninja` conda package (stand-in for conda-forge's; the env locks PyPI's, the same binary) built
from Debian's ninja-build .deb: `bin/ninja`, nothing else.

`apt-get download` (verified against apt's sha256), `dpkg -x`, packaged with tests/support/channel.py.
Cached per machine in ``~/.cache/lingbot-fixtures/ninja-<deb sha256[:16]>/`` (appears atomically).
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


def _candidate() -> dict[str, str]:
    proc = subprocess.run(
        ["apt-cache", "show", "--no-all-versions", "ninja-build"], capture_output=True, text=True
    )
    fields = dict(re.findall(r"^([A-Za-z0-9-]+): (.*)$", proc.stdout, flags=re.M))
    if "SHA256" not in fields:
        raise NinjaBuildError(f"apt-cache knows no ninja-build ({proc.stderr.strip()}); run `apt-get update`")
    return {"version": fields["Version"], "sha256": fields["SHA256"]}


def ninja_package(cache_root: Path | None = None) -> Path:
    """The .conda file of the `ninja` stand-in, built on first use."""
    cache_root = Path(cache_root) if cache_root is not None else default_cache_root()
    deb = _candidate()
    final = cache_root / f"ninja-{deb['sha256'][:16]}"
    version = deb["version"].split(":")[-1].split("-")[0]  # 1.11.1-2~deb12u1 -> 1.11.1
    built = sorted(final.glob("ninja-*.conda"))
    if built:
        return built[0]
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".ninja-build-", dir=cache_root))
    try:
        proc = subprocess.run(
            ["apt-get", "download", f"ninja-build={deb['version']}"], cwd=tmp, capture_output=True, text=True
        )
        debs = sorted(tmp.glob("ninja-build_*.deb"))
        if proc.returncode != 0 or len(debs) != 1:
            raise NinjaBuildError(f"apt-get download ninja-build failed: {proc.stderr.strip()}")
        if hashlib.sha256(debs[0].read_bytes()).hexdigest() != deb["sha256"]:
            raise NinjaBuildError(f"{debs[0].name}: sha256 differs from apt's index; not using it")
        subprocess.run(["dpkg", "-x", str(debs[0]), str(tmp / "x")], check=True)
        out = tmp / "out"
        make_package(out, "ninja", version, {"bin/ninja": tmp / "x" / "usr" / "bin" / "ninja"})
        (out / "SOURCE").write_text(f"{debs[0].name} sha256 {deb['sha256']}\n")
        try:
            os.rename(out, final)
        except OSError:
            if not sorted(final.glob("ninja-*.conda")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(final.glob("ninja-*.conda"))[0]
