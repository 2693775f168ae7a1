"""The kinds of rule the config's one table (rules.py) is made of, and the common ones.

Rule(allowed, ok, bad)   ok(value, cfg) says whether the value is allowed; `allowed` is what the error
                         says; `bad` is a --set value that breaks the rule (tests/test_config_rules.py
                         walks every one). ok=None: the field's type alone judges it (a bool).
Free(why)                no value is judgeable without data or weights; `why` says where it is judged
Because(reason)          raised by an `ok` that asks another module's own check (the simulator's): the
                         line adds that check's reason after what is allowed
BOOL, POSITIVE, NON_NEGATIVE, FRACTION, _one_of(*names)    the rules many fields share
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer.config.schema import RunConfig


@dataclass(frozen=True)
class Rule:
    allowed: str
    ok: Callable[[Any, RunConfig], bool] | None
    bad: str
    related: tuple[str, ...] = ()  # keys `ok` also reads: their values and sources are named with it


@dataclass(frozen=True)
class Free:
    why: str


class Because(ValueError):
    """A broken rule, with the reason another module's own check gave (added to the rule's line)."""


def _finite(v: Any) -> bool:
    """inf passes `> 0` (train.lr=inf ran and diverged at step 2); nan fails every comparison anyway."""
    return not isinstance(v, float) or math.isfinite(v)


def _positive(v: Any, c: Any) -> bool:
    return _finite(v) and bool(v > 0)


def _non_negative(v: Any, c: Any) -> bool:
    return _finite(v) and bool(v >= 0)


def _fraction(v: Any, c: Any) -> bool:
    return bool(0 <= v <= 1)


def _one_of(*names: str) -> Rule:
    return Rule("one of " + ", ".join(names), lambda v, c: v in names, "nope")


BOOL = Rule("true or false", None, "maybe")
POSITIVE = Rule("> 0", _positive, "0")
NON_NEGATIVE = Rule(">= 0", _non_negative, "-1")
FRACTION = Rule("in 0..1", _fraction, "1.5")


def value_of(cfg: RunConfig, key: str) -> Any:
    target: Any = cfg
    for part in key.split("."):
        target = getattr(target, part)
    return target


def judged(key: str, rule: Rule, cfg: RunConfig, sources: dict[str, str] | None) -> tuple[int, str] | None:
    """(rank, line) when cfg's value of `key` breaks `rule`, else None. The line says where the value came
    from, the key, the value, what is allowed, and the related keys' values and sources; rank 0 when the
    value or a related one was set on the command line, 1 for the config file's, 2 for the rest."""
    if rule.ok is None:
        return None
    value = value_of(cfg, key)
    reason = ""
    try:
        ok = rule.ok(value, cfg)
    except Because as exc:
        ok, reason = False, f": {exc}"
    except (TypeError, ValueError, ZeroDivisionError):
        ok = False
    if ok:
        return None
    default = "the default" if sources is not None else f"config {cfg.name!r}"
    where = (sources or {}).get(key, default)
    line = f"{where}: {key}={value!r} is not allowed: {key} must be {rule.allowed}{reason}"
    if rule.related:  # e.g. --set model.heads=5 breaks model.dim's rule: say so, and name it first
        named = (f"{k}={value_of(cfg, k)!r} from {(sources or {}).get(k, default)}" for k in rule.related)
        line += " (with " + ", ".join(named) + ")"
    set_too = any((sources or {}).get(k) == "--set" for k in rule.related)
    rank = 0 if where == "--set" or set_too else 2 if where.endswith(("(cpu_scale)", "the default")) else 1
    return rank, line
