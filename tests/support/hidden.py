"""A command run with some of an env's files gone, the env itself untouched: the missing-piece runs of
envcheck (tests/test_envcheck.py on x86 in the worker simulation, tests/test_emulation_aarch64_worker.py in
the emulated aarch64 worker). The files go in a private mount namespace, from an overlay over the env's
generation at its own path (whiteouts in the overlay's upper dir), so a killed run leaves nothing to
restore and a cached env is never changed."""

from __future__ import annotations

import json
import os
from pathlib import Path


def package_files(prefix: Path, hide: list[str]) -> list[str]:
    """`hide` relative to `prefix`, with each `conda-meta:NAME` entry expanded to every file of that
    package (its conda-meta record's `files`: e.g. the sysroot's glibc dev files and kernel headers)."""
    out = []
    for rel in hide:
        if rel.startswith("conda-meta:"):
            (record,) = (prefix / "conda-meta").glob(f"{rel.split(':', 1)[1]}-*.json")
            out += json.loads(record.read_text())["files"]
        else:
            out.append(rel)
    return out


def without(prefix: Path, hide: list[str], argv: list[str], scratch: Path) -> list[str]:
    """`argv` in a private mount namespace where the env's files `hide` (relative to its prefix) are gone:
    an overlay over the env's generation at the same path, the files deleted in it. Every listed file must
    exist and go (xargs fails the script otherwise): nothing is hidden by accident. Root."""
    gen = Path(os.path.realpath(prefix))
    (scratch / "upper").mkdir(parents=True)
    (scratch / "work").mkdir()
    (scratch / "hide").write_text("".join(f"{rel}\0" for rel in hide))
    script = (
        "set -e; mount --make-rprivate /"
        '; mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$1"'
        '; cd "$1"; xargs -0 rm -- < "$4"; shift 4; exec "$@"'
    )
    layers = [str(gen), str(scratch / "upper"), str(scratch / "work"), str(scratch / "hide")]
    return ["unshare", "--mount", "sh", "-c", script, "hide", *layers, *argv]
