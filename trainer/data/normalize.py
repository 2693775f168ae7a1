"""Quantile action normalisation, as LingBot-VA does: q01 -> -1, q99 -> +1 per channel, clipped (1.5 there).

Statistics come from the data (every action of every episode), so they are the same on every rank.
A channel whose q01 and q99 coincide (e.g. a constant gripper) normalises to 0.
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
