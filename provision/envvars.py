"""The env's variables: one file in the prefix that the activate.d/deactivate.d hooks, bin/envcheck and
bin/train all read, so an activated shell and a plain `$PREFIX/bin/python` job see the same values.

The file, $PREFIX/etc/lingbot/env-vars, is written by bin/provision: the variables computed from the
linked prefix (provision/activation.py), then environment.yml's `variables:`. One entry a line, in order:

    default CFLAGS -march=nocona -mtune=haswell ... -isystem ${CONDA_PREFIX}/include
    set CC ${CONDA_PREFIX}/bin/x86_64-conda-linux-gnu-cc
    prepend CPATH ${CONDA_PREFIX}/include
    set TRITON_CACHE_DIR ${HOME}/.triton/cache_lingbot-b200_b200

`set` replaces the variable; `default` sets it only when it is unset or empty (the `${NAME:-value}` of
conda-forge's compiler scripts: a user's own CFLAGS stays); `prepend` puts the value in front of the
current one (joined with ":", no empty element when there was none), unless the current one already
starts with it (so re-applying after a package's own activate.d script does not double it). Besides the
spec's `variables:`, the file holds what the packages' own activate.d scripts set (captured at provision
time), so a job that is not activated sees what an activated shell sees.
Values may reference `${NAME}`: CONDA_PREFIX, HOME, USER or an entry above. The sh hooks expand values
with `eval`, so the grammar is strict (no quotes, backslashes, backticks or other `$` uses) and checked
on both write and read. Stdlib only: used inside the env.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from provision.prefix import provision_command

ENV_VARS_RELPATH = Path("etc") / "lingbot" / "env-vars"
MODES = ("set", "default", "prepend")
# Names a value may reference besides the entries above it (all set by any login/batch shell or conda).
AMBIENT_REFERENCES = ("CONDA_PREFIX", "HOME", "USER")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SAFE_VALUE = re.compile(r'(?:[^"\\`$\n\t\r]|\$\{[A-Za-z_][A-Za-z0-9_]*\})+\Z')


class EnvVarsError(ValueError):
    """An env-vars entry that cannot be used; the message names the source and the fix."""


@dataclass(frozen=True)
class EnvVar:
    mode: str  # one of MODES
    name: str
    value: str  # as stored: may reference ${CONDA_PREFIX}, ${HOME}, ...


def validate(entries: Iterable[EnvVar], source: str) -> list[EnvVar]:
    """The entries, checked against the grammar the sh hooks rely on; EnvVarsError names `source`."""
    checked: list[EnvVar] = []
    seen: set[str] = set()
    for entry in entries:
        where = f"{source}: variable {entry.name!r}"
        if entry.mode not in MODES:
            raise EnvVarsError(f"{where}: mode {entry.mode!r} is not one of {', '.join(MODES)}")
        if not _NAME.match(entry.name):
            raise EnvVarsError(f"{where}: not a valid shell variable name (letters, digits, _)")
        if entry.name in seen:
            raise EnvVarsError(f"{where}: defined twice; keep one definition")
        if entry.value != entry.value.strip() or not _SAFE_VALUE.match(entry.value):
            raise EnvVarsError(
                f"{where}: value {entry.value!r} must be non-empty plain text without surrounding spaces, "
                f"quotes, backslashes, backticks or '$' other than ${{NAME}} references"
            )
        for ref in _REFERENCE.findall(entry.value):
            if ref not in seen and ref not in AMBIENT_REFERENCES:
                raise EnvVarsError(
                    f"{where}: references ${{{ref}}}, which is neither one of "
                    f"{', '.join(AMBIENT_REFERENCES)} nor a variable defined before it"
                )
        seen.add(entry.name)
        checked.append(entry)
    return checked


def format_env_vars(entries: Iterable[EnvVar], header: str = "") -> str:
    """The file text for `entries` (validated)."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [f"{e.mode} {e.name} {e.value}" for e in validate(entries, "env-vars")]
    return "\n".join(lines) + "\n"


def parse_env_vars(text: str, source: str) -> list[EnvVar]:
    """Entries of an env-vars file's text; EnvVarsError names `source` and the line."""
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        parts = stripped.split(None, 2)
        if len(parts) != 3:
            raise EnvVarsError(f"{source}:{number}: expected 'MODE NAME VALUE', got {line!r}")
        entries.append(EnvVar(*parts))
    return validate(entries, source)


def env_vars_path(prefix: Path) -> Path:
    return Path(prefix) / ENV_VARS_RELPATH


def read_env_vars(prefix: Path) -> list[EnvVar]:
    path = env_vars_path(prefix)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path} does not exist: {prefix} was not provisioned by bin/provision (or not completely); "
            f"provision it: {provision_command(prefix)}"
        ) from None
    return parse_env_vars(text, str(path))


def load_env_vars(prefix: Path) -> dict[str, str]:
    """The env's variables as stored (values may reference ${CONDA_PREFIX}, ${HOME}); for `prepend`
    entries the value is the part put in front."""
    return {e.name: e.value for e in read_env_vars(prefix)}


def expand(value: str, scope: Mapping[str, str]) -> str:
    """Substitute ${NAME} from `scope` (unset -> empty), as the sh hook's eval does."""
    return _REFERENCE.sub(lambda m: scope.get(m.group(1), ""), value)


def apply_env_vars(entries: Iterable[EnvVar], env: dict[str, str]) -> dict[str, str]:
    """Apply `entries` to `env` in order, exactly like activate.d/zz-lingbot-env-vars.sh."""
    for entry in entries:
        value = expand(entry.value, env)
        old = env.get(entry.name, "")
        if entry.mode == "default" and old:
            continue
        if entry.mode == "prepend" and old:
            value = old if old == value or old.startswith(f"{value}:") else f"{value}:{old}"
        env[entry.name] = value
    return env


def job_environment(prefix: Path, base: Mapping[str, str]) -> dict[str, str]:
    """The environment a job gets without activation: `base`, plus CONDA_PREFIX and PATH with the env's
    bin first (what `conda activate` adds), plus the env's variables. The env's CC/CXX always win."""
    prefix_str = str(Path(prefix).absolute())
    env = dict(base)
    env["CONDA_PREFIX"] = prefix_str
    bin_dir = os.path.join(prefix_str, "bin")
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}" if env.get("PATH") else bin_dir
    return apply_env_vars(read_env_vars(prefix), env)
