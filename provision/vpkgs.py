"""Virtual packages (__glibc, __cuda, ...): what the solve assumes the workers provide.

Contract: one `VirtualPackages` per platform, read from and written to conda-lock's
`--virtual-package-spec` format (`subdirs: {linux-64: {packages: {__glibc: "2.35", ...}}}`), so the
same committed file drives `bin/provision --relock` and `conda-lock lock --virtual-package-spec`.
`conda_lock_defaults()` is what conda-lock assumes when it is given no such file (its own
default-virtual-packages.yaml); drift checks of a lock that records none use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DEFAULT_FILE_NAME = "virtual-packages.yml"  # beside environment.yml


class VirtualPackagesError(ValueError):
    """A virtual-package file that cannot be used; the message names the file and the fix."""


@dataclass(frozen=True)
class VirtualPackages:
    """What the workers provide: ubuntu 22.04 (glibc 2.35, kernel 5.15), the cluster's CUDA driver."""

    glibc: str = "2.35"
    cuda: str = "13.0"  # torch 2.13's PyPI wheel is built for CUDA 13.0: driver >= 580 on the nodes
    linux: str = "5.15"
    archspec: str = "x86_64"

    def as_dict(self) -> dict[str, str]:
        out = {
            "__unix": "0",
            "__linux": self.linux,
            "__glibc": self.glibc,
            "__archspec": f"1 {self.archspec}",
        }
        if self.cuda:
            out["__cuda"] = self.cuda
        return out

    @classmethod
    def from_dict(cls, d: dict[str, str]) -> VirtualPackages:
        return cls(
            glibc=str(d["__glibc"]),
            cuda=str(d.get("__cuda", "")),
            linux=str(d["__linux"]),
            archspec=str(d["__archspec"]).split()[-1],
        )

    def for_rattler(self) -> list:
        from rattler import BuildString, GenericVirtualPackage, PackageName, Version

        out = []
        for name, spec in self.as_dict().items():
            version, _, build = spec.partition(" ")
            out.append(GenericVirtualPackage(PackageName(name), Version(version), BuildString(build or "0")))
        return out


# conda's __archspec of each platform's generic CPU (what bin/provision assumes without a file)
ARCHSPEC = {"linux-64": "x86_64", "linux-aarch64": "aarch64", "linux-ppc64le": "ppc64le"}


def platform_default(platform: str) -> VirtualPackages:
    """bin/provision's defaults for `platform`: ubuntu 22.04 workers, CUDA 13.0, its generic CPU."""
    return VirtualPackages(archspec=ARCHSPEC.get(platform, platform.rsplit("-", 1)[-1]))


def spec_document(by_platform: dict[str, VirtualPackages]) -> dict[str, Any]:
    """conda-lock's --virtual-package-spec document for `by_platform`."""
    return {"subdirs": {p: {"packages": v.as_dict()} for p, v in by_platform.items()}}


def write_spec_file(path: Path, by_platform: dict[str, VirtualPackages]) -> None:
    from provision.atomic import write_atomic

    header = (
        "# Virtual packages the workers provide, in conda-lock's --virtual-package-spec format.\n"
        "# Used by `bin/provision lingbot-b200 --relock` and by\n"
        "# `conda-lock lock -f environment.yml --virtual-package-spec virtual-packages.yml`.\n"
    )
    write_atomic(path, header + yaml.safe_dump(spec_document(by_platform), sort_keys=False))


def read_spec_file(path: Path) -> dict[str, VirtualPackages]:
    """The platforms of a --virtual-package-spec file; VirtualPackagesError names the file and key."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise VirtualPackagesError(
            f"{path}: no such virtual-package file; pass --virtual-package-spec PATH"
        ) from None
    except yaml.YAMLError as exc:
        raise VirtualPackagesError(f"{path}: malformed YAML ({exc}); fix the file") from None
    subdirs = data.get("subdirs") if isinstance(data, dict) else None
    if not isinstance(subdirs, dict) or not subdirs:
        raise VirtualPackagesError(f"{path}: expected `subdirs: {{PLATFORM: {{packages: {{...}}}}}}`")
    out = {}
    for platform, body in subdirs.items():
        packages = body.get("packages") if isinstance(body, dict) else None
        if not isinstance(packages, dict):
            raise VirtualPackagesError(f"{path}: subdirs.{platform}.packages must be a mapping")
        try:
            out[str(platform)] = VirtualPackages.from_dict({str(k): str(v) for k, v in packages.items()})
        except KeyError as exc:
            raise VirtualPackagesError(
                f'{path}: subdirs.{platform}.packages lacks {exc.args[0]}; add it (e.g. __glibc: "2.35")'
            ) from None
    return out


def conda_lock_defaults(platform: str) -> VirtualPackages | None:
    """conda-lock's own default virtual packages for `platform` (None: it has none for it)."""
    import conda_lock.virtual_package as vp

    data = yaml.safe_load(Path(vp.DEFAULT_VIRTUAL_PACKAGES_YAML_PATH).read_text())
    packages = (data.get("subdirs", {}).get(platform) or {}).get("packages")
    if not packages or "__glibc" not in packages:
        return None
    return VirtualPackages.from_dict({str(k): str(v) for k, v in packages.items()})
