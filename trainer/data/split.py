"""The held-out split, by episode: which episodes are never trained on and score the model instead.

    train, held_out = split_episodes(names, val)     # names: each episode's stable identifier

`names` are the episodes' paths relative to the discovered episode folder, as the latent cache's
manifest records them (`<timestamp>/<timestamp>.pkl`): the same on every rank, in every attempt, and
after the cache is prepared again. Each name is ranked by sha256(SALT + name) and the `k` lowest are held out:
    k = val                      when val is a whole number >= 1 (a count: data.val_episodes=2)
    k = max(1, round(val * n))   when 0 < val < 1 (a fraction of the n episodes)
    k = 0                        when val == 0 (no split: every episode trains)
The choice never depends on the order of `names`, a position, the rank count or the seed, so resumes and
other rank counts hold out the same episodes; adding an episode changes the held-out set only when its
hash ranks among the k lowest. Both lists come back in the order of `names`.

A split that leaves nothing to train on (n <= k) is SplitError naming both numbers; a val that is neither
a count nor a fraction is SplitError too. trainer/data/stream.py applies it (training clips come from
`train` only), trainer/loop/validate.py scores `held_out`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from trainer.data.formats.furniturebench import DatasetError

SALT = "lingbot-val-split-v1:"  # part of the rule: changing it changes every run's held-out set
RULE = "sha256('lingbot-val-split-v1:' + episode path); the k lowest are held out"


class SplitError(DatasetError):
    """data.val_episodes cannot be applied to this dataset; the message names both numbers."""


def split_key(name: str) -> str:
    """An episode's rank in the split (hex): lower is held out first."""
    return hashlib.sha256((SALT + name).encode()).hexdigest()


def held_out_count(n: int, val: float) -> int:
    """How many of `n` episodes data.val_episodes=`val` holds out (0 = no split)."""
    if isinstance(val, bool) or not isinstance(val, int | float) or math.isnan(val) or val < 0:
        raise SplitError(
            f"data.val_episodes={val!r}: expected 0 (off), a count >= 1, or a fraction in (0, 1)"
        )
    if val == 0:
        return 0
    if val >= 1:
        if float(val) != int(val):
            raise SplitError(
                f"data.val_episodes={val!r}: a count must be a whole number (or use a fraction in (0, 1))"
            )
        return int(val)
    return max(1, round(val * n))


def split_episodes(names: Sequence[str], val: int | float) -> tuple[list[str], list[str]]:
    """(train, held_out) names, each in the order of `names`; see the module docstring for the rule."""
    names = list(names)
    if len(set(names)) != len(names):
        raise SplitError("split_episodes: episode names must be unique")
    k = held_out_count(len(names), val)
    if k == 0:
        return names, []
    if len(names) <= k:
        raise SplitError(
            f"data.val_episodes={val:g} holds out {k} episode(s) but the dataset has only {len(names)} "
            f"usable episode(s), leaving none to train on; lower data.val_episodes (0 turns the split off) "
            f"or add episodes"
        )
    chosen = set(sorted(names, key=split_key)[:k])
    return [n for n in names if n not in chosen], [n for n in names if n in chosen]


def split_record(names: Sequence[str], val: int | float) -> dict:
    """What summary.json and the cache manifest record of a split."""
    train, held_out = split_episodes(names, val)
    return {"val_episodes": val, "rule": RULE, "train": len(train), "held_out": held_out}


__all__ = ["RULE", "SplitError", "held_out_count", "split_episodes", "split_key", "split_record"]
