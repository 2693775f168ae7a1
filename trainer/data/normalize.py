"""Quantile action normalisation, as LingBot-VA does: q01 -> -1, q99 -> +1 per channel, clipped (1.5 there).

Statistics come from the data (every action of every training episode: data.normalize fit), so they are the
same on every rank. A channel whose q01 and q99 coincide (e.g. a constant gripper) normalises to 0.
A LeRobot dataset's own statistics (meta/stats.json or episodes_stats.jsonl, recorded in the cache
manifest's "lerobot" record) serve instead with data.normalize quantile (its q01/q99) or mean_std
(MeanStdNormalizer: (x - mean) / std, clipped likewise): `dataset_normalizer`. With data.normalize fixed
the statistics are the config's (data.norm_q01 / norm_q99, upstream's norm_stat: what a released checkpoint
was trained with), in slot order; `config_normalizer` reorders them to the action columns' order (column i
is slot data.action_slots[i]) and needs no data at all (bin/serve of a released folder).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEGENERATE_RANGE = 1e-6


@dataclass
class QuantileNormalizer:
    q01: np.ndarray  # (D,)
    q99: np.ndarray  # (D,)

    @classmethod
    def fit(cls, actions: np.ndarray) -> QuantileNormalizer:
        """actions (N, D): any number of rows, all episodes concatenated."""
        actions = np.asarray(actions, np.float64)
        if actions.ndim != 2 or actions.shape[0] == 0:
            raise ValueError(
                f"QuantileNormalizer.fit: expected a non-empty (N, D) array, got {actions.shape}"
            )
        q01, q99 = np.quantile(actions, [0.01, 0.99], axis=0)
        return cls(q01.astype(np.float32), q99.astype(np.float32))

    def _range(self) -> np.ndarray:
        return self.q99 - self.q01

    def normalize(self, actions: np.ndarray, clip: float = 1.0) -> np.ndarray:
        """q01 -> -1, q99 -> +1, clipped to [-clip, clip] (the reference clips at 1.5)."""
        span = self._range()
        ok = span > DEGENERATE_RANGE
        out = 2.0 * (actions - self.q01) / np.where(ok, span, 1.0) - 1.0
        return np.where(ok, np.clip(out, -clip, clip), 0.0).astype(np.float32)

    def denormalize(self, normalized: np.ndarray) -> np.ndarray:
        span = self._range()
        ok = span > DEGENERATE_RANGE
        out = (np.asarray(normalized) + 1.0) / 2.0 * span + self.q01
        return np.where(ok, out, self.q01).astype(np.float32)

    def to_json(self) -> str:
        return json.dumps({"q01": self.q01.tolist(), "q99": self.q99.tolist()})

    def save(self, path: Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: Path) -> QuantileNormalizer:
        d = json.loads(Path(path).read_text())
        return cls(np.array(d["q01"], np.float32), np.array(d["q99"], np.float32))


@dataclass
class MeanStdNormalizer:
    mean: np.ndarray  # (D,)
    std: np.ndarray  # (D,)

    def normalize(self, actions: np.ndarray, clip: float = 1.0) -> np.ndarray:
        ok = self.std > DEGENERATE_RANGE
        out = (actions - self.mean) / np.where(ok, self.std, 1.0)
        return np.where(ok, np.clip(out, -clip, clip), 0.0).astype(np.float32)

    def denormalize(self, normalized: np.ndarray) -> np.ndarray:
        ok = self.std > DEGENERATE_RANGE
        return np.where(ok, np.asarray(normalized) * self.std + self.mean, self.mean).astype(np.float32)


def dataset_normalizer(cfg, manifest: dict, directory: Path) -> QuantileNormalizer | MeanStdNormalizer | None:
    """The normaliser data.normalize asks for from the dataset's statistics; None for fit (the stream fits).
    ValueError naming the manifest and the fix when the dataset has no such statistics."""
    how = cfg.data.normalize
    if how == "fit":
        return None
    if how == "fixed":
        return config_normalizer(cfg)
    stats = (manifest.get("lerobot") or {}).get("stats") or {}
    need = {"quantile": ("q01", "q99"), "mean_std": ("mean", "std")}[how]
    if not all(k in stats for k in need):
        raise ValueError(
            f"{directory / 'manifest.json'}: data.normalize={how} needs the dataset's {'/'.join(need)} "
            f"statistics (a LeRobot dataset's meta/stats.json or episodes_stats.jsonl has {sorted(stats)}); "
            "set data.normalize=fit to compute quantiles from the training episodes"
        )
    a, b = (np.asarray(stats[k], np.float32) for k in need)
    return QuantileNormalizer(a, b) if how == "quantile" else MeanStdNormalizer(a, b)


def config_normalizer(cfg) -> QuantileNormalizer:
    """data.normalize fixed: data.norm_q01 / norm_q99 (model.action_dim wide, slot order) as a normaliser
    of the action columns (column i -> slot data.action_slots[i], [] = trainer/recipe/batch.py ACTION_SLOTS).
    ValueError naming the keys when they are missing or too short for the slots."""
    from trainer.recipe.batch import ACTION_SLOTS

    slots = list(cfg.data.action_slots or ACTION_SLOTS)
    q01, q99 = (np.asarray(v, np.float32) for v in (cfg.data.norm_q01, cfg.data.norm_q99))
    if q01.size <= max(slots) or q99.size <= max(slots):
        raise ValueError(
            f"data.normalize=fixed needs data.norm_q01 and data.norm_q99 with a value for every slot up to "
            f"{max(slots)} (model.action_dim wide, slot order); they have {q01.size} and {q99.size}"
        )
    return QuantileNormalizer(q01[slots], q99[slots])


def stats_record(normalizer, latent_stats) -> dict:
    """What a checkpoint records of the statistics its run trained with (train_state.json "data_stats"):
    the action normaliser's and the stand-in latents' per-channel (mean, std), as lists."""
    record: dict = {}
    if isinstance(normalizer, QuantileNormalizer):
        record["actions"] = {"q01": normalizer.q01.tolist(), "q99": normalizer.q99.tolist()}
    elif isinstance(normalizer, MeanStdNormalizer):
        record["actions"] = {"mean": normalizer.mean.tolist(), "std": normalizer.std.tolist()}
    if latent_stats is not None:
        mean, std = (np.asarray(x, np.float64).ravel().tolist() for x in latent_stats)
        record["latents"] = {"mean": mean, "std": std}
    return record


def stats_differ(recorded: dict, normalizer, latent_stats) -> str | None:
    """How the statistics at hand differ from a checkpoint's recorded ones (first difference), or None."""
    now = stats_record(normalizer, latent_stats)
    for part in ("actions", "latents"):
        was, is_ = recorded.get(part) or {}, now.get(part) or {}
        if sorted(was) != sorted(is_):
            return f"{part}: trained with {sorted(was) or 'none'}, now {sorted(is_) or 'none'}"
        for key in was:
            a, b = np.asarray(was[key], np.float64), np.asarray(is_[key], np.float64)
            if a.shape != b.shape:
                return f"{part} {key}: {a.size} channels when trained, {b.size} now"
            off = np.flatnonzero(~np.isclose(a, b, rtol=1e-5, atol=1e-6))
            if off.size:
                i = int(off[0])
                return f"{part} {key}[{i}] was {a[i]:.6g} in training, is {b[i]:.6g} now"
    return None
