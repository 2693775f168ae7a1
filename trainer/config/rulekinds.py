"""The kinds of rule the config's one table (rules.py) is made of, and the common ones.

Rule(allowed, ok, bad)   ok(value, cfg) says whether the value is allowed; `allowed` is what the error
                         says; `bad` is a --set value that breaks the rule (tests/test_config_rules.py
                         walks every one). ok=None: the field's type alone judges it (a bool).
Free(why)                no value is judgeable without data or weights; `why` says where it is judged
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
