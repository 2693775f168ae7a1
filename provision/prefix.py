"""Where envs live and whether one is complete.

Layout made by bin/provision (see provision/install.py for why):

    <envs_dir>/lingbot-b200            -> symlink to .lingbot-b200.gens/<generation>
    <envs_dir>/.lingbot-b200.gens/<g>/ the real prefix, built in place (conda packages bake their
                                        install path into files, so a prefix is never moved)
    <prefix>/conda-meta/lingbot-provision.json   the completion manifest, written LAST

An env is complete only when its manifest exists, parses, says it is complete, was written for the
directory it sits in, and the files it names are present. Stdlib only: bin/train imports this inside
the env, where the provisioning tools are not installed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

DEFAULT_ENV_NAME = "lingbot-b200"
MANIFEST_RELPATH = Path("conda-meta") / "lingbot-provision.json"
MANIFEST_FORMAT = 1


def envs_dir() -> Path:
    """conda's envs directory: the first entry of $CONDA_ENVS_PATH, else ~/.conda/envs."""
    first = os.environ.get("CONDA_ENVS_PATH", "").split(os.pathsep)[0].strip()
    return Path(first).expanduser().absolute() if first else Path.home() / ".conda" / "envs"


def resolve_prefix(name: str | None = None, prefix: str | os.PathLike[str] | None = None) -> Path:
    """Explicit prefix > name under envs_dir(); neither: $CONDA_PREFIX if set, else the default env.

    The path is made absolute but symlinks are kept: the env's name is the symlink, not its generation.
    """
    if prefix is not None:
        return Path(prefix).expanduser().absolute()
    if name is not None:
        return envs_dir() / name
    active = os.environ.get("CONDA_PREFIX")
    if active:
        return Path(active).expanduser().absolute()
    return envs_dir() / DEFAULT_ENV_NAME


def provision_command(prefix: Path, env_name: str | None = None) -> str:
    """The bin/provision command that (re)builds `prefix`, runnable as written: the spec's env name
    (`env_name`, else the manifest's, else the default), --prefix unless it is that name's default place."""
    prefix = Path(prefix)
    if env_name is None:
        try:
            env_name = str(json.loads(manifest_path(prefix).read_text()).get("env_name") or "") or None
        except (OSError, ValueError, AttributeError):
            env_name = None
    name = env_name or DEFAULT_ENV_NAME
    at = "" if prefix.absolute() == envs_dir() / name else f" --prefix {prefix}"
    return f"bin/provision {name}{at}"


def manifest_path(prefix: Path) -> Path:
    return Path(prefix) / MANIFEST_RELPATH


def read_manifest(prefix: Path) -> dict:
    """The completion manifest of `prefix`; FileNotFoundError / ValueError name the file and the fix."""
    path = manifest_path(prefix)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path} does not exist: {prefix} was not made by bin/provision or its provision did not "
            f"finish; run `{provision_command(prefix)}` (it replaces the env atomically)"
        ) from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); re-run `{provision_command(prefix)}`") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path}: expected a JSON object; re-run `{provision_command(prefix)}`")
    return manifest


def completeness(prefix: Path) -> tuple[bool, str]:
    """(True, "") only if a provision of `prefix` finished; else (False, the reason and the fix)."""
    prefix = Path(prefix)
    fix = f"rebuild it: {provision_command(prefix)}"
    if not prefix.exists():
        what = "a dangling symlink" if prefix.is_symlink() else "missing"
        return False, f"env {prefix} is {what}; {fix}"
    try:
        manifest = read_manifest(prefix)
    except (OSError, ValueError) as exc:
        return False, str(exc)
    if manifest.get("format") != MANIFEST_FORMAT:
        return (
            False,
            f"{manifest_path(prefix)}: manifest format {manifest.get('format')!r}, expected "
            f"{MANIFEST_FORMAT}; {fix}",
        )
    if manifest.get("complete") is not True:
        return False, f"{manifest_path(prefix)} does not mark the env complete; {fix}"
    real = os.path.realpath(prefix)
    if manifest.get("generation") != real:
        return False, (
            f"{prefix} resolves to {real} but its manifest was written for {manifest.get('generation')}: "
            f"the env was moved or copied, and conda envs do not relocate; {fix}"
        )
    for rel in manifest.get("files", []):
        if not (prefix / rel).exists():
            return False, f"{prefix / rel} named by the manifest is missing: the env was damaged; {fix}"
    return True, ""
