"""Several LeRobot dataset roots in one run: `data.path: /data/a,/data/b` (data.format lerobot; a rule in
trainer/config/rules.py refuses commas otherwise).

    roots = data_roots(cfg)                    # [Path], each resolved as trainer/data/cache/location.py does
    one = for_root(cfg, root)                  # a copy of cfg whose data.path is that root alone
    parts = [...]                              # each root's load_cached (trainer/data/stream.py does it)
    latents, actions, text, summary, names, normalised = combine(cfg, parts, log)

Each root keeps its own latent cache (prepared and checked exactly as a single root's: manifest, staleness,
resume); the stream concatenates their episodes. An episode's name (the held-out split's identifier) is
`<k>:<root name>/<its file>` (k the root's position), so the split is recomputed over all roots together
(trainer/data/split.py) and not taken from any one manifest. Task prompts are merged (each root's task
table appended). Normalisation: data.normalize fit (quantiles of all training episodes); the datasets' own
statistics are per root, so quantile/mean_std with several roots is refused, naming the fix.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from trainer.data.cache.location import resolve_data_path
from trainer.data.formats.furniturebench import DatasetError
from trainer.data.split import split_record


def data_roots(cfg) -> list[Path]:
    parts = [p.strip() for p in str(cfg.data.path).split(",") if p.strip()]
    return (
        [resolve_data_path(for_root(cfg, Path(p))) for p in parts]
        if len(parts) > 1
        else [resolve_data_path(cfg)]
    )


def for_root(cfg, root: Path):
    one = copy.deepcopy(cfg)
    one.data.path = str(root)
    return one


def _merge_text(texts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    merged = dict(texts[0])
    offsets = np.cumsum([0] + [len(t["task_emb"]) for t in texts[:-1]])
    merged["task_emb"] = np.concatenate([t["task_emb"] for t in texts])
    merged["task_mask"] = np.concatenate([t["task_mask"] for t in texts])
    merged["episode_task"] = np.concatenate(
        [t["episode_task"] + o for t, o in zip(texts, offsets, strict=True)]
    )
    return merged


def combine(cfg, parts: list[tuple], log: Callable[[str], None]) -> tuple:
    """parts[k] = (latents, actions, text, summary, names, manifest) of root k (trainer/data/stream.py's
    load_cached, plus the manifest) -> (latents, actions, text, summary, names, normalised) of them all."""
    if cfg.data.normalize != "fit":
        raise DatasetError(
            f"data.path={cfg.data.path}: several roots have one set of statistics each; "
            "set data.normalize=fit (quantiles of all training episodes) or train on one root"
        )
    roots = data_roots(cfg)
    latents = [x for part in parts for x in part[0]]
    actions = [x for part in parts for x in part[1]]
    texts = [part[2] for part in parts]
    summaries = [part[3] for part in parts]
    names = [f"{k}:{roots[k].name}/{n}" for k, part in enumerate(parts) for n in part[4]]
    normalised = {part[5]["spec"]["encoder"] != "patch_mean" for part in parts}
    if not latents:
        raise DatasetError(f"data.path={cfg.data.path}: no usable episodes in any root")
    if not all("task_emb" in t for t in texts):
        raise DatasetError(f"data.path={cfg.data.path}: several roots are read for LeRobot datasets only")
    if len(normalised) > 1:
        raise DatasetError(f"data.path={cfg.data.path}: the roots' caches were made with different encoders")
    summary = dataclasses.replace(
        summaries[0], root=", ".join(s.root for s in summaries), found=sum(s.found for s in summaries),
        used=sum(s.used for s in summaries),
        skipped=dict(sum((Counter(s.skipped) for s in summaries), Counter())),
        skipped_files=[f for s in summaries for f in s.skipped_files],
        cache=", ".join(s.cache for s in summaries), split=split_record(names, cfg.data.val_episodes),
        stand_ins=sorted({x for s in summaries for x in s.stand_ins}),
    )  # fmt: skip
    held = summary.split["held_out"] if summary.split else []
    log(summary.describe() + f" over {len(parts)} roots")
    log(f"data: {len(held)} of {len(names)} episodes held out, never trained on: {', '.join(held)}")
    return latents, actions, _merge_text(texts), summary, names, normalised == {True}
