"""bin/evaluate's pictures: per evaluated episode, one PNG of predicted vs recorded actions per channel.

    path = plot_episode(directory, name, trace, channel_names)

`trace` is openloop.evaluate_episode's: per chunk (first action row, predicted [rows, C], recorded
[rows, C]) in robot units. One panel per channel, the action index (10 Hz steps from the episode's start)
on x, the recorded actions in black and the predicted ones in colour, a dashed vertical line where each
chunk starts (the model saw the real history up to there). Rendered with matplotlib's Agg backend (no
display), written atomically (provision/atomic.py). The file name is the episode name with path separators
replaced, e.g. `2026-01-01-00:01:00__2026-01-01-00:01:00.pkl.png`.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from provision.atomic import write_atomic


def file_name(episode: str) -> str:
    return re.sub(r"[^A-Za-z0-9._:-]+", "__", episode).strip("_") + ".png"


def plot_episode(directory: Path, episode: str, trace: list, channels: Sequence[str]) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display; must precede pyplot's import
    import matplotlib.pyplot as plt

    rows = len(channels)
    fig, axes = plt.subplots(rows, 1, figsize=(10, 1.6 * rows + 0.8), sharex=True, squeeze=False)
    try:
        for c, name in enumerate(channels):
            ax = axes[c, 0]
            for i, (start, pred, real) in enumerate(trace):
                x = np.arange(start, start + pred.shape[0])
                ax.plot(x, real[:, c], color="black", lw=1.2, label="recorded" if i == 0 else None)
                ax.plot(x, pred[:, c], color="tab:orange", lw=1.2, label="predicted" if i == 0 else None)
                ax.axvline(start, color="tab:blue", ls="--", lw=0.7, alpha=0.6)
            ax.set_ylabel(name)
            ax.grid(alpha=0.3)
        axes[0, 0].legend(loc="upper right", fontsize=8)
        axes[0, 0].set_title(f"{episode}: predicted vs recorded actions (dashed: chunk starts)", fontsize=9)
        axes[-1, 0].set_xlabel("action step")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90)
    finally:
        plt.close(fig)
    path = Path(directory) / file_name(episode)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, buf.getvalue())
    return path
