"""Load a RunConfig: trainer/config/presets/<name>.yaml, its `cpu_scale:` block on a machine without a GPU,
then `--set key=value` overrides; every value coerced to its field's type and judged by the one table of
rules (trainer/config/rules.py) before it is returned.

A config file holds the cluster-scale experiment at the top level and, under `cpu_scale:`, the overrides
used on a machine without a GPU (smaller model, fewer steps). Keys are dotted paths: `train.steps=40`.
A preset may start from another (`base: libero`: that preset's values at each scale, its own on top).
`sources` ({dotted key: where its value came from}) follows every value for the error lines.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from trainer.config.rules import check
from trainer.config.schema import ConfigError, RunConfig

CONFIG_DIR = Path(__file__).parent / "presets"
# Where a value came from, for error lines and for model.pretrained (trainer/model/weights.py): "--set",
# the config file's path, or the path + CPU_SCALE_MARK for its cpu_scale block (not the user's choice).
CPU_SCALE_MARK = " (cpu_scale)"
SET = "--set"
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _field_types(cls) -> dict[str, typing.Any]:
    return typing.get_type_hints(cls)


def _coerce(value, annotation, key: str, source: str = ""):
    """Turn a YAML value or a --set string into the field's type, or raise ConfigError naming the key."""
    origin = typing.get_origin(annotation)
    try:
        if annotation is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
                return value.lower() in _TRUE
            raise ValueError
        if annotation is int:
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if annotation is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if annotation is str:
            if isinstance(value, bool):  # true/false of a str option that also takes words (compile)
                return str(value).lower()
            if not isinstance(value, str | int | float):
                raise ValueError
            return str(value)
        if origin is list or annotation is list:
            (item,) = typing.get_args(annotation) or (str,)
            if isinstance(value, str):
                value = [v for v in value.strip("[]").split(",") if v.strip()]
            if not isinstance(value, list):
                raise ValueError
            return [_coerce(v.strip() if isinstance(v, str) else v, item, key, source) for v in value]
        if isinstance(annotation, types.UnionType):
            raise ValueError
    except (TypeError, ValueError):
        pass
    else:
        return value
    name = getattr(annotation, "__name__", str(annotation))
    kinds = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}
    allowed = kinds.get(name, f"a {name}")
    where = f"{source}: " if source else ""
    raise ConfigError(f"{where}bad value {value!r} for {key}: {key} must be {allowed}")


def apply_overrides(
    cfg: RunConfig, overrides: dict, source: str, sources: dict[str, str] | None = None
) -> None:
    """Apply {dotted.key: value} to cfg in place; unknown keys and bad values raise ConfigError.
    `sources` (if given) records `source` for every key set."""
    for key, value in overrides.items():
        parts = key.split(".")
        target = cfg
        for i, part in enumerate(parts):
            hints = _field_types(type(target))
            if part not in hints:
                known = ", ".join(sorted(hints)) if i else ", ".join(sorted(h for h in hints))
                raise ConfigError(f"{source}: unknown key {key!r} (known at this level: {known})")
            if i == len(parts) - 1:
                if dataclasses.is_dataclass(getattr(target, part)):
                    raise ConfigError(
                        f"{source}: {key!r} is a section; set one of its keys, e.g. {key}.<field>"
                    )
                setattr(target, part, _coerce(value, hints[part], key, source))
                if sources is not None:
                    sources[key] = source
            else:
                target = getattr(target, part)
                if not dataclasses.is_dataclass(target):
                    raise ConfigError(f"{source}: {'.'.join(parts[: i + 1])!r} is not a section")


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def parse_set(items: list[str]) -> dict:
    """--set key=value strings to a dict; a malformed item raises ConfigError."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set train.steps=100")
        out[key.strip()] = value.strip()
    return out


def config_from_dict(tree: dict[str, Any], source: str) -> RunConfig:
    """The inverse of RunConfig.to_dict (generic over the dataclass fields): every value is coerced and
    checked as a YAML value is, unknown keys raise ConfigError naming `source`, then check()."""
    if not isinstance(tree, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    tree = dict(tree)
    name = tree.pop("name", None)
    cfg = RunConfig(name=str(name) if name is not None else RunConfig().name)
    sources: dict[str, str] = {}
    apply_overrides(cfg, _flatten(tree), source, sources)
    check(cfg, sources)  # the same table as the launcher's (trainer/config/rules.py)
    return cfg


def _preset_tree(name: str) -> tuple[Path, dict]:
    path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown config {name!r}: no {path} (available: {', '.join(available_configs())})")
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return path, tree


def _preset_layers(name: str, seen: tuple[str, ...]) -> list[tuple[Path, dict, dict]]:
    """The preset's (file, top level, cpu_scale block) flattened, after those of its `base:` preset (and the
    base's base): a preset that says `base: libero` is libero's values with its own on top, at each scale
    (the base's top level, the preset's, then the base's cpu_scale block, the preset's)."""
    path, tree = _preset_tree(name)
    base = tree.pop("base", None)
    cpu_block = tree.pop("cpu_scale", {}) or {}
    layers = []
    if base is not None:
        if not isinstance(base, str) or base in (name, *seen):
            chain = " -> ".join((*seen, name, str(base)))
            raise ConfigError(f"{path}: base: {base!r} is not another preset ({chain}); name one preset")
        layers = _preset_layers(base, (*seen, name))
    return [*layers, (path, _flatten(tree), _flatten(cpu_block))]


def available_configs() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def load_config(name: str, cpu_scale: bool, overrides: dict | None = None) -> RunConfig:
    """Load trainer/config/presets/<name>.yaml; apply its cpu_scale block when asked, then the overrides."""
    return resolve_config(name, cpu_scale, overrides)[0]


def resolve_config(
    name: str, cpu_scale: bool, overrides: dict | None = None
) -> tuple[RunConfig, dict[str, str]]:
    """load_config, plus where each value that is not a default came from ({dotted key: source})."""
    cfg, sources = RunConfig(name=name), dict[str, str]()
    layers = _preset_layers(name, ())
    for flat, source in [(top, str(path)) for path, top, _ in layers]:
        apply_overrides(cfg, flat, source, sources)
    if cpu_scale:
        for flat, source in [(cpu, f"{path}{CPU_SCALE_MARK}") for path, _, cpu in layers]:
            apply_overrides(cfg, flat, source, sources)
    if overrides:
        apply_overrides(cfg, overrides, SET, sources)
    _root_preset_paths(cfg, sources)
    _anchor_set_paths(cfg, sources)
    check(cfg, sources)
    return cfg, sources


# Encoder folders a config file names relative (models/lingbot-va-base/vae) are relative to the repo root,
# as its model.pretrained and data.path are; a --set path is the user's own (the working directory's:
# _anchor_set_paths).
ROOTED_PATHS = ("data.vae_path", "data.text_encoder", "data.tokenizer")
# The folders a --set names: the working directory's when relative (_anchor_set_paths)
SET_PATH_KEYS = ("data.path", "model.pretrained", "data.cache_dir", *ROOTED_PATHS)


def _root_preset_paths(cfg: RunConfig, sources: dict[str, str]) -> None:
    for key in ROOTED_PATHS:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value and sources.get(key, SET) != SET and not Path(value).expanduser().is_absolute():
            from provision.paths import repo_root

            setattr(getattr(cfg, section), name, str(repo_root() / value))


def _anchor_set_paths(cfg: RunConfig, sources: dict[str, str]) -> None:
    """A relative --set path is the working directory's, where the user typed it: made absolute here, so
    the ranks (and a requeued attempt's config.json) read the same folder. Before this, data.path and
    model.pretrained were taken as the repo root's, a preset's rule, and `--set data.path=reldata` generated
    its episodes inside the checkout."""
    for key in SET_PATH_KEYS:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value and sources.get(key) == SET:
            setattr(getattr(cfg, section), name, _anchored(key, str(value)))


def _anchored(key: str, value: str) -> str:
    """`value` of path key `key` with each relative path made the working directory's: data.path's every
    comma-separated root (several LeRobot roots), stripped as parse_set strips a value (a review found only
    the first root anchored, and a leading space anchored as part of the path)."""
    parts = [p.strip() for p in value.split(",")] if key == "data.path" else [value.strip()]
    return ",".join(p if not p or Path(p).expanduser().is_absolute() else str(Path.cwd() / p) for p in parts)


def anchored_set_item(item: str) -> str:
    """One `--set KEY=VALUE` as the working directory means it: a relative path of SET_PATH_KEYS made
    absolute (what _anchor_set_paths does to the config), for a command line run from another folder (the
    --sbatch script cds to the checkout)."""
    key, sep, value = item.partition("=")
    key = key.strip()
    if sep and key in SET_PATH_KEYS and value.strip():
        return f"{key}={_anchored(key, value)}"
    return item


def user_set(source: str | None) -> bool:
    """Whether a value's source is the user's own choice: --set or the config file, not its cpu_scale
    block (the CPU variant's stand-in sizes) and not a default."""
    return source is not None and not source.endswith(CPU_SCALE_MARK)
