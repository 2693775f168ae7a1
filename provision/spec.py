"""environment.yml (conda's format): the env's name, channels, conda and pip dependencies, variables.

One env per file, as in conda. `platforms:` lists the subdirs the lock covers (default linux-64); a
line ending in a conda-lock platform selector (`# [linux64]`, `# [aarch64]`, `# [linux]`, `# [unix]`)
belongs only to the platforms it names, exactly as conda-lock's own parser reads it (`for_platform`
gives one platform's conda and pip lists; `conda`/`pip` are those of the first platform). A selector
conda-lock does not know is refused naming file:line. Two things beyond what `conda env create` reads:
- pip entries that are local paths ("./sub", relative to the file) are a user's own packages: not
  locked, installed by bin/provision with --no-deps (conda-lock cannot parse such a spec: this
  checkout's environment.yml has none, bin/provision installs the checkout in its own step);
- `variables:` values may reference ${NAME} (CONDA_PREFIX, HOME, USER, CC, CXX, CPATH, a variable
  above); they are expanded at activation (see provision/envvars.py), not at provision time. The
  compiler variables are not the spec's: they come from the linked prefix (provision/activation.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from provision.activation import COMPUTED_VARIABLES
from provision.envvars import EnvVar, EnvVarsError, validate
from provision.paths import RepoRootError, repo_root

_LOCAL_PIP = re.compile(r"^(\.{1,2}(/.*)?|/.*|file:.*)$")
_KNOWN_KEYS = {"name", "channels", "dependencies", "variables", "platforms", "prefix"}
# conda-lock's platform selectors: the names each platform answers to (conda-build's names)
SELECTORS = {
    "linux-64": {"linux64", "unix", "linux"},
    "linux-aarch64": {"aarch64", "unix", "linux"},
    "linux-ppc64le": {"ppc64le", "unix", "linux"},
    "osx-64": {"osx64", "osx", "unix"},
    "osx-arm64": {"arm64", "osx", "unix"},
    "win-64": {"win", "win64"},
}
_SELECTOR = re.compile(r"#[^#]*\[([^\[\]]+)\]\s*$")


class SpecError(ValueError):
    """An environment.yml that cannot be used; the message names the file (and line) and the fix."""


@dataclass(frozen=True)
class EnvSpec:
    path: Path
    name: str
    channels: list[str]
    conda: list[str]  # conda match specs, as written
    pip: list[str]  # requirement strings locked against PyPI
    pip_local: list[Path] = field(default_factory=list)  # project paths installed with --no-deps
    variables: dict[str, str] = field(default_factory=dict)  # in file order
    platforms: list[str] = field(default_factory=lambda: ["linux-64"])
    # per platform: (conda specs, pip requirements) after its selectors; empty: the same on every platform
    selected: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)

    def for_platform(self, platform: str) -> EnvSpec:
        """This spec as conda-lock reads it for `platform`: only the lines its selectors keep."""
        if platform not in self.selected:
            return self
        conda, pip = self.selected[platform]
        return replace(self, conda=list(conda), pip=list(pip))

    def conda_names(self) -> set[str]:
        return {re.split(r"[\s=<>!~\[]", s, maxsplit=1)[0] for s in self.conda}

    def variable_entries(self) -> list[EnvVar]:
        """The spec's `variables:`, in file order. The compiler variables before them are computed from
        the linked prefix (provision/activation.py); a value here may reference them (${CC})."""
        computed = [EnvVar("set", name, "computed") for name in COMPUTED_VARIABLES]
        entries = [EnvVar("set", k, v) for k, v in self.variables.items()]
        try:
            return validate(computed + entries, f"{self.path}: variables")[len(computed) :]
        except EnvVarsError as exc:
            raise SpecError(str(exc)) from None


def _yaml_error(path: Path, exc: yaml.YAMLError) -> SpecError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
    problem = getattr(exc, "problem", None) or str(exc)
    return SpecError(f"{where}: malformed YAML: {problem}; fix the file (conda's environment.yml format)")


def default_spec() -> Path:
    """This checkout's environment.yml."""
    return repo_root() / "environment.yml"


def select_lines(path: Path, text: str, platform: str | None) -> str:
    """`text` with the lines whose selector excludes `platform` removed (None: only validated); a
    selector conda-lock would not apply (unknown name, an expression) is a SpecError naming file:line."""
    known = set().union(*SELECTORS.values())
    kept = []
    for number, line in enumerate(text.splitlines(), 1):
        match = None if line.lstrip().startswith("#") else _SELECTOR.search(line)
        if match is None:
            kept.append(line)
            continue
        name = match.group(1).strip()
        if name not in known:
            raise SpecError(
                f"{path}:{number}: selector [{name}] is not one conda-lock applies (it knows "
                f"{', '.join(sorted(known))}, one name per line); write one line per platform"
            )
        if platform is None or name in SELECTORS.get(platform, set()):
            kept.append(line)
    return "\n".join(kept) + "\n"


def _load_yaml(path: Path, text: str) -> dict:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc) from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping with name/channels/dependencies at the top level")
    return data


def _dependencies(path: Path, data: dict) -> tuple[list[str], list[str], list[Path]]:
    conda, pip, pip_local = [], [], []
    listed = data.get("dependencies") or []
    if not isinstance(listed, list):  # a string would be read letter by letter
        raise SpecError(
            f"{path}: `dependencies:` must be a list (one `- package` per line), not {listed!r:.60}"
        )
    for dep in listed:
        if isinstance(dep, str):
            conda.append(dep.strip())
        elif isinstance(dep, dict) and set(dep) == {"pip"} and isinstance(dep["pip"], list):
            for req in dep["pip"]:
                req = str(req).strip()
                if _LOCAL_PIP.match(req):
                    pip_local.append((path.parent / req.removeprefix("file:")).resolve())
                else:
                    pip.append(req)
        else:
            raise SpecError(f"{path}: dependency {dep!r} is neither a conda spec string nor a `pip:` list")
    if not conda:
        raise SpecError(f"{path}: `dependencies:` lists no conda packages")
    if (pip or pip_local) and "pip" not in {re.split(r"[\s=<>]", c)[0] for c in conda}:
        raise SpecError(f"{path}: a `pip:` section needs `pip` among the conda dependencies")
    return conda, pip, pip_local


def _platforms(path: Path, data: dict) -> list[str]:
    platforms = data.get("platforms") or ["linux-64"]
    if not isinstance(platforms, list) or not all(isinstance(p, str) for p in platforms):
        raise SpecError(f"{path}: `platforms:` must list conda subdirs, e.g. [linux-64, linux-aarch64]")
    unknown = [p for p in platforms if p not in SELECTORS]
    if unknown:
        raise SpecError(f"{path}: `platforms:` names {unknown}; known: {', '.join(SELECTORS)}")
    return list(platforms)


def load_spec(path: Path | str | None = None, unnamed: str | None = None) -> EnvSpec:
    """The spec at `path` (default: this checkout's). `unnamed`: the env name to use when the file has no
    `name:` (conda-lock's own environment.yml need not have one; bin/provision's NAME then names it)."""
    path = Path(path if path is not None else default_spec()).absolute()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: no such spec file; pass --file PATH to an environment.yml") from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    data = _load_yaml(path, select_lines(path, text, None))
    unknown = set(data) - _KNOWN_KEYS
    if unknown:
        raise SpecError(f"{path}: unknown top-level keys {sorted(unknown)}; allowed: {sorted(_KNOWN_KEYS)}")
    name = data.get("name", unnamed)
    if name is None:
        raise SpecError(f"{path}: no `name:`; add `name: ENV`, or give the env's NAME on the command line")
    if not valid_env_name(name):
        raise SpecError(f"{path}: `name:` must be an env name (letters, digits, . _ -), got {name!r}")
    channels = data.get("channels") or []
    if not isinstance(channels, list) or not channels or not all(isinstance(c, str) for c in channels):
        raise SpecError(f"{path}: `channels:` must list at least one channel, e.g. [conda-forge]")
    platforms = _platforms(path, data)
    selected = {}
    for platform in platforms:
        conda, pip, pip_local = _dependencies(path, _load_yaml(path, select_lines(path, text, platform)))
        selected[platform] = (tuple(conda), tuple(pip))

    variables = data.get("variables") or {}
    if not isinstance(variables, dict):
        raise SpecError(f"{path}: `variables:` must be a mapping NAME: value")
    variables = {str(k): str(v) for k, v in variables.items()}
    clash = sorted(set(variables) & set(COMPUTED_VARIABLES))
    if clash:
        raise SpecError(
            f"{path}: `variables:` sets {clash}, which bin/provision computes from the compiler packages "
            f"(absolute paths into the env); remove them"
        )
    conda, pip = (list(x) for x in selected[platforms[0]])
    spec = EnvSpec(path, name, list(channels), conda, pip, pip_local, variables, platforms, selected)
    spec.variable_entries()  # validates the variables now, naming the file
    return spec


def provision_command(spec: EnvSpec, lock_path: Path, *flags: str) -> str:
    """`bin/provision NAME [-f SPEC] [--lockfile LOCK] FLAGS` for `spec` and `lock_path`, runnable as written
    from anywhere: -f unless the spec is this checkout's, --lockfile unless the lock is conda-lock.yml beside
    the spec (what bin/provision reads without them)."""
    try:
        default: Path | None = default_spec()
    except RepoRootError:
        default = None
    words = ["bin/provision", spec.name]
    if default is None or spec.path.absolute() != default.absolute():
        words += ["-f", str(spec.path)]
    if Path(lock_path).absolute() != (spec.path.parent / "conda-lock.yml").absolute():
        words += ["--lockfile", str(lock_path)]
    return " ".join([*words, *flags])


def valid_env_name(name: object) -> bool:
    """An env name conda accepts and a path and PATH entry cannot misread: letters, digits, . _ -, the first
    a letter or digit (no `/`, `..`, `:` or space)."""
    return isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) is not None


def check_env_name(spec: EnvSpec, name: str | None) -> None:
    """Refuse an env name the spec does not declare (conda's format holds one env per file)."""
    if name is not None and name != spec.name:
        raise SpecError(
            f"env {name!r} is not declared in {spec.path} (it declares {spec.name!r}); "
            f"use `bin/provision {spec.name}` or pass --file with the spec that declares {name!r}"
        )
