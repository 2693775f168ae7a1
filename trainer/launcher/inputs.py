"""The preflight's judgement of what needs the data or the weights (exit 3 when wrong, no rank started).

Values judgeable without them are trainer/config_rules.py's (exit 2, before this). Here, without reading
the episodes or the weights in full:
- data: data.path holds episodes of data.task, or they may be generated there (the same rule and message
  as the ranks' trainer/data/stream.py ensure_dataset: `missing_episodes`);
- weights: model.pretrained's files hold exactly the tensors, by name and shape, of the model its
  config.json describes (safetensors headers against the model built on the meta device; the same
  check_layout the ranks' strict load runs).
What only reading them can show (an unreadable episode, a camera view the files lack) is found by the
ranks: one line, and the last line says the next run fails the same way until the data is fixed.
"""

from __future__ import annotations

from trainer.config import RunConfig
from trainer.launcher.errors import PreflightError


def inputs_check(cfg: RunConfig) -> list[str]:
    """Notes for the terminal; PreflightError naming the file and the fix when the inputs cannot work."""
    return [_data_note(cfg), *_weights_notes(cfg)]


def _data_note(cfg: RunConfig) -> str:
    from trainer.data.discovery import discover
    from trainer.data.location import resolve_data_path
    from trainer.data.stream import missing_episodes

    root = resolve_data_path(cfg)
    files = discover(root, cfg.data.task).files
    problem = missing_episodes(cfg, root) if not files else None
    if problem:
        raise PreflightError(problem)
    if files:
        return f"data: {len(files)} {cfg.data.task} episode file(s) under {root}"
    return f"data: no episodes under {root}: the ranks generate {cfg.data.generated_episodes} there"


def _weights_notes(cfg: RunConfig) -> list[str]:
    if not cfg.model.pretrained:
        return []
    import torch

    from trainer.model.network import WorldModel
    from trainer.model.weights import (
        PretrainedError,
        check_layout,
        expected_layout,
        resolve_transformer_dir,
        tensor_shapes,
        weight_files,
    )

    try:
        folder = resolve_transformer_dir(cfg.model.pretrained)
        with torch.device("meta"):
            model = WorldModel(cfg)
        ignored = check_layout(expected_layout(model), tensor_shapes(weight_files(folder)), folder)
    except PretrainedError as exc:
        raise PreflightError(str(exc)) from exc
    return [f"weights: {folder} holds every tensor of the model, by name and shape"] + (
        [f"weights: ignored as the reference does: {', '.join(ignored)}"] if ignored else []
    )
