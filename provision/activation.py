"""The env's computed variables, decided from what the linked prefix holds: what the packages' own
activate.d scripts set, and CC/CXX/CPATH from the compilers that are there.

Contract: `env_entries(prefix, platform, spec_entries)` runs after linking, before bin/provision writes
its own hook, and returns the entries of $PREFIX/etc/lingbot/env-vars, in this order:
1. what the installed packages' activate.d scripts set (`captured`): the `etc/conda/activate.d/*.sh`
   files that conda-meta records list, in conda's order (by file name), sourced in a clean `bash`
   (`env -i`: CONDA_PREFIX, PATH with the env's bin first, placeholder HOME and USER; no compiler
   needed) twice: once with nothing set, once with every variable the first pass changed preset to a
   probe value. From the two, per variable: `set` (it replaced whatever was there), `default` (it kept
   a non-empty value: the `${CFLAGS:-...}` of conda-forge's compiler scripts) or `prepend`. The prefix,
   HOME and USER in values are stored as ${CONDA_PREFIX}, ${HOME}, ${USER}; the scripts' own backups
   (CONDA_BACKUP_*) are bookkeeping and not recorded.
2. CC/CXX = ${CONDA_PREFIX}/bin/<triplet>-cc / -c++ when an installed record holds that executable (the
   absolute path into the env wins over a captured value, as the zz- hook does in an activated shell),
   and CPATH prepended with ${CONDA_PREFIX}/include when there is a compiler. A prefix without one
   gets none of the three (bin/envcheck reports the missing CC).
3. the spec's `variables:` (a name the spec sets replaces a captured one, as in an activated shell).
What an entry cannot express (a value with quotes, `$`, backslashes or nothing in it; a variable a
script removes or appends to; one that depends on the caller's value in any other way) stops the
provision with one line naming the scripts and the variable (ActivationError). Known limit: a variable
a script only unsets (never sets) when the caller had it is not seen. Stdlib only.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from provision.envvars import EnvVar, EnvVarsError, validate
from provision.hooks import HOOK_NAME

# Bump when what is captured, or how, changes: part of the state hash, so envs are re-provisioned.
CAPTURE_VERSION = "1"
# Host triplet of conda-forge's cross-prefixed compilers per platform.
TRIPLETS = {
    "linux-64": "x86_64-conda-linux-gnu",
    "linux-aarch64": "aarch64-conda-linux-gnu",
    "linux-ppc64le": "powerpc64le-conda-linux-gnu",
}
COMPILER_TOOLS = {"CC": "cc", "CXX": "c++"}
# Variables provision computes from the compilers in the prefix; a spec may not set them itself.
COMPUTED_VARIABLES = ("CC", "CXX", "CPATH")
ACTIVATE_DIR = Path("etc/conda/activate.d")
# Shell bookkeeping that differs between any two shells: never an env variable.
_SHELL_NOISE = {"_", "PWD", "OLDPWD", "SHLVL"}
_CAPTURE = """
__lingbot_env=$1 __lingbot_out=$2; shift 2
for __lingbot_script in "$@"; do
  set --
  . "$__lingbot_script"
done
"$__lingbot_env" -0 >"$__lingbot_out/after"
"""


class ActivationError(RuntimeError):
    """The packages' activate.d scripts do something env-vars cannot hold; the message says what."""


def installed_files(prefix: Path) -> set[str]:
    """Every file the prefix's conda-meta records list (paths relative to the prefix)."""
    files: set[str] = set()
    for record in sorted((Path(prefix) / "conda-meta").glob("*.json")):
        try:
            data = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "name" in data and isinstance(data.get("files"), list):
            files.update(str(f) for f in data["files"])
    return files


def activation_scripts(prefix: Path, files: set[str]) -> list[Path]:
    """The installed packages' activate.d/*.sh scripts, in the order conda sources them."""
    scripts = [
        f for f in files if Path(f).parent == ACTIVATE_DIR and f.endswith(".sh") and Path(f).name != HOOK_NAME
    ]
    return [Path(prefix) / f for f in sorted(scripts, key=lambda f: Path(f).name)]


def compiler_entries(prefix: Path, platform: str, files: set[str]) -> list[EnvVar]:
    """CC/CXX for the `<triplet>-cc`/`-c++` executables installed records hold; CPATH with any."""
    triplet = TRIPLETS.get(platform)
    entries = []
    for var, tool in COMPILER_TOOLS.items():
        rel = f"bin/{triplet}-{tool}"
        if triplet and rel in files and os.access(Path(prefix) / rel, os.X_OK):
            entries.append(EnvVar("set", var, f"${{CONDA_PREFIX}}/{rel}"))
    if entries:
        # headers installed into the env (e.g. by pip wheels' include dirs) before the sysroot's
        entries.append(EnvVar("prepend", "CPATH", "${CONDA_PREFIX}/include"))
    return entries


def _run(scripts: list[Path], base: dict[str, str]) -> tuple[dict[str, str], str]:
    """The environment left after sourcing `scripts` in a clean bash started with `base`, and its output."""
    bash, env_bin = shutil.which("bash"), shutil.which("env")
    if not bash or not env_bin:
        raise ActivationError(
            "bash and env are needed to read the packages' activate.d scripts; install bash"
        )
    with tempfile.TemporaryDirectory(prefix="lingbot-activation-") as out:
        cmd = [bash, "--noprofile", "--norc", "-c", _CAPTURE, "capture", env_bin, out, *map(str, scripts)]
        try:
            proc = subprocess.run(cmd, env=base, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise ActivationError(f"sourcing {_names(scripts)} did not finish in 120 s") from None
        said = (proc.stdout + proc.stderr).strip()
        try:
            dump = (Path(out) / "after").read_text(errors="replace")
        except OSError:
            raise ActivationError(f"sourcing {_names(scripts)} ended the shell: {said[-500:]}") from None
    after = dict(item.split("=", 1) for item in dump.split("\0") if "=" in item)
    return {k: v for k, v in after.items() if k not in _SHELL_NOISE}, said


def _names(scripts: list[Path]) -> str:
    return ", ".join(f"{ACTIVATE_DIR}/{s.name}" for s in scripts) or "no scripts"


def captured_entries(prefix: Path, scripts: list[Path], log=print) -> list[EnvVar]:
    """What sourcing `scripts` does to an environment, as env-vars entries (see the module contract)."""
    if not scripts:
        return []
    real = os.path.realpath(prefix)
    token = secrets.token_hex(6)
    home, user = f"/nonexistent/lingbot-capture-home-{token}", f"lingbot-capture-user-{token}"
    base = {
        "PATH": f"{real}/bin:/usr/bin:/bin",
        "HOME": home,
        "USER": user,
        "CONDA_PREFIX": real,
        "LANG": "C",
    }
    first, said = _run(scripts, base)
    if said:
        log(f"{_names(scripts)} said: {said[-300:]}")
    changed = [k for k in first if first[k] != base.get(k) and not k.startswith("CONDA_BACKUP_")]
    changed += [k for k in base if k not in first]
    probes = {k: f"lingbot-probe-{k}" for k in changed if k not in base}
    second, _ = _run(scripts, {**base, **probes})

    def stored(name: str, value: str, how: str) -> str:
        value = value.replace(real, "${CONDA_PREFIX}").replace(home, "${HOME}").replace(user, "${USER}")
        if not value:
            raise ActivationError(
                f"{_names(scripts)} in {prefix} {how} {name} to an empty value, which "
                f"etc/lingbot/env-vars cannot hold; report the package"
            )
        return value

    entries = []
    for name in changed:
        was = base[name] if name in base else probes[name]
        got, probed = first.get(name), second.get(name)
        cannot = ActivationError(
            f"{_names(scripts)} in {prefix}: {name} becomes {probed!r} when it was {was!r} before "
            f"(and {got!r} when unset); etc/lingbot/env-vars can only set, default or prepend a variable"
        )
        if got is None or probed is None or name in ("HOME", "USER", "CONDA_PREFIX"):
            raise cannot
        if name in base:  # PATH and LANG: only a prepend keeps the caller's value
            if not got.endswith(f":{was}"):
                raise cannot
            entries.append(EnvVar("prepend", name, stored(name, got[: -len(was) - 1], "prepends")))
        elif probed == got:
            entries.append(EnvVar("set", name, stored(name, got, "sets")))
        elif probed == was:
            entries.append(EnvVar("default", name, stored(name, got, "defaults")))
        elif probed.endswith(f":{was}") and got in (probed[: -len(was) - 1], probed[: -len(was)]):
            entries.append(EnvVar("prepend", name, stored(name, probed[: -len(was) - 1], "prepends")))
        else:
            raise cannot
    try:
        return validate(entries, f"{prefix}: what {_names(scripts)} set")
    except EnvVarsError as exc:
        raise ActivationError(f"{exc}; etc/lingbot/env-vars cannot hold it, report the package") from None


def env_entries(
    prefix: Path, platform: str, spec_entries: list[EnvVar], source: str, log=print
) -> list[EnvVar]:
    """The env-vars entries for a linked prefix (see the module contract); validated."""
    files = installed_files(prefix)
    captured = captured_entries(prefix, activation_scripts(prefix, files), log)
    computed = compiler_entries(prefix, platform, files)
    replaced = {e.name for e in computed} | {e.name for e in spec_entries}
    entries = [e for e in captured if e.name not in replaced] + computed + list(spec_entries)
    try:
        return validate(
            entries, f"{prefix}/etc/lingbot/env-vars (from {source} and the packages' activate.d)"
        )
    except EnvVarsError as exc:
        raise ActivationError(str(exc)) from None
