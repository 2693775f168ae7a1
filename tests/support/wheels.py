"""Real wheels and a real PEP 503 simple index as static files, for the pip part of a lock.

`write_wheel` writes a pure-python wheel as the wheel spec says (RECORD with hashes);
`write_simple_index` a file:// index pip reads, with sha256 fragments in its links.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path


def write_wheel(
    out_dir: Path,
    name: str,
    version: str,
    module_source: str,
    requires: Sequence[str] = (),
    tag: str = "py3-none-any",
    extra: Mapping[str, bytes] | None = None,
) -> Path:
    """A wheel with one module `name`, written as the wheel spec says (RECORD hashes); `tag` its
    compatibility tag (e.g. cp311-cp311-manylinux_2_28_aarch64: one wheel per architecture); `extra`
    more members by their path in the wheel (`NAME-VERSION.dist-info/entry_points.txt`,
    `NAME-VERSION.data/scripts/...`)."""
    dist_info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    members = {
        f"{name}.py": module_source.encode(),
        f"{dist_info}/METADATA": metadata.encode(),
        f"{dist_info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: {tag}\n".encode()
        ),
    }
    members.update(extra or {})
    record = []
    for path, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    members[f"{dist_info}/RECORD"] = ("\n".join(record + [f"{dist_info}/RECORD,,"]) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in members.items():
            zf.writestr(path, data)
    return wheel


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_simple_index(index_dir: Path, wheels: list[Path]) -> str:
    """A PEP 503 index as static files (pip reads file:// directories' index.html); hashes in the links."""
    links: dict[str, list[str]] = {}
    for wheel in wheels:
        links.setdefault(wheel.name.split("-")[0], []).append(
            f'<a href="{wheel.resolve().as_uri()}#sha256={sha256_of(wheel)}">{wheel.name}</a>'
        )
    for name, anchors in links.items():
        project = index_dir / name
        project.mkdir(parents=True, exist_ok=True)
        (project / "index.html").write_text(
            f"<!DOCTYPE html><html><body>{'<br>'.join(anchors)}</body></html>\n"
        )
    return index_dir.resolve().as_uri() + "/"
