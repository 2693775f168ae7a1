"""The preflight's judgement of what needs the data or the weights (exit 3 when wrong, no rank started).

Values judgeable without them are trainer/config/rules.py's (exit 2, before this). Here, without reading
the episodes or the weights in full:
- data: data.path holds episodes of data.task, or they may be generated there (the same rule and message
  as the ranks' trainer/data/formats/sources.py ensure_dataset: `missing_episodes`; the libero preset's
  CPU scale records its LeRobot dataset there when it has none; for a run that resumes, only on the
  data.path its checkpoint trained on, where the same seeded episodes are made again); a LeRobot dataset's
  meta/, cameras (in info.json, codec decodable), action columns, and every listed episode's parquet and
  videos;
- encoders: data.vae_path (data.encoder wan_vae) and data.text_encoder hold their config.json (and the
  tokenizer files), by the encoders' own folder rules (trainer/data/encoding/folders.py, torch-free);
- weights: model.pretrained's files hold exactly the tensors, by name and shape, of the model its
  config.json describes (safetensors headers against the model built on the meta device; the same
  check_layout the ranks' strict load runs).
What only reading them can show (an unreadable episode, a camera view the files lack) is found by the
ranks: one line, and the last line says the next run fails the same way until the data is fixed.
"""

from __future__ import annotations

from pathlib import Path

from trainer.config import RunConfig
from trainer.launcher.errors import PreflightError


def inputs_check(cfg: RunConfig, resumes: tuple[Path, str] | None = None) -> list[str]:
    """Notes for the terminal; PreflightError naming the file and the fix when the inputs cannot work.
    `resumes`: (the checkpoint this run resumes from, the data.path it was trained on): another data.path
    with no episodes is refused, never generated or recorded into (the run would go on with other data)."""
    return [_data_note(cfg, resumes), *_encoder_notes(cfg), *_weights_notes(cfg)]


def _encoder_notes(cfg: RunConfig) -> list[str]:
    from trainer.data.encoding.folders import EncoderError, text_folders, vae_folder

    notes = []
    try:
        if cfg.data.encoder == "wan_vae":
            notes.append(f"encoder: the Wan2.2 VAE in {vae_folder(cfg.data.vae_path)}")
        if cfg.data.text_encoder:
            enc, tok = text_folders(cfg.data.text_encoder, cfg.data.tokenizer)
            notes.append(f"text encoder: {enc} (tokenizer {tok})")
    except EncoderError as exc:
        raise PreflightError(str(exc)) from exc
    return notes


def _data_note(cfg: RunConfig, resumes: tuple[Path, str] | None) -> str:
    from trainer.data.formats.multiroot import data_roots, for_root

    roots = data_roots(cfg)
    if len(roots) > 1:
        return "; ".join(_root_note(for_root(cfg, root), resumes) for root in roots)
    return _root_note(cfg, resumes)


def _root_note(cfg: RunConfig, resumes: tuple[Path, str] | None = None) -> str:
    from trainer.data.cache.location import resolve_data_path
    from trainer.data.formats.sources import (
        LEROBOT,
        data_format,
        discover_source,
        missing_episodes,
        records_libero,
    )

    root = resolve_data_path(cfg)
    if root.exists() and not root.is_dir():
        raise PreflightError(
            f"data.path={cfg.data.path}: {root} is a file; set data.path to the dataset's folder"
        )
    if data_format(cfg, root) == LEROBOT and (root / "meta/info.json").is_file():
        return _lerobot_note(cfg, root)
    found = discover_source(cfg, root)
    files = found.files
    problem = missing_episodes(cfg, root) if not files else None
    if problem:
        raise PreflightError(problem)
    if files:
        _cache_makeable(cfg, found.root)
        return f"data: {len(files)} {cfg.data.task} episode file(s) under {root}" + _generated_note(cfg, root)
    if resumes is not None and not _same_data_path(cfg, root, resumes[1]):
        checkpoint, trained_on = resumes
        raise PreflightError(
            f"data.path={cfg.data.path}: no episodes under {root}, and this run resumes from {checkpoint}, "
            f"trained on data.path={trained_on}: new episodes made there would continue it on other data; "
            "point data.path at the dataset it was trained on, or start a new run with --run-dir"
        )
    _writable_or_makeable(cfg, root)  # the ranks write episodes there: said now, not as their traceback
    if records_libero(cfg, root):
        _can_record(cfg, root)
        return (
            f"data: no LeRobot dataset at {root}: the ranks record {cfg.data.generated_episodes} scripted "
            f"demonstration(s) of at most {cfg.data.generated_length} steps there in LIBERO's simulator "
            f"(tasks {cfg.data.generated_tasks or 'with experts'}; a scripted expert's, not human "
            "demonstrations; first use)"
        )
    return f"data: no episodes under {root}: the ranks generate {cfg.data.generated_episodes} there"


def _generated_note(cfg: RunConfig, root: Path) -> str:
    """A generated folder made with other data.generated_* counts than the config's, said: those settings
    apply to an empty folder only, and were ignored unsaid (found by a review)."""
    import json

    try:
        made = json.loads((root / "GENERATED.json").read_text())
    except (OSError, ValueError):
        return ""
    wanted = {"episodes": cfg.data.generated_episodes, "length": cfg.data.generated_length}
    other = {k: made.get(k) for k, v in wanted.items() if isinstance(made, dict) and made.get(k) != v}
    if not other:
        return ""
    said = ", ".join(f"{k} {v} (data.generated_{k}={wanted[k]})" for k, v in other.items())
    return (
        f"; generated earlier with {said}: those settings make a new folder only (remove {root} to "
        "generate again with them)"
    )


def _same_data_path(cfg: RunConfig, root: Path, trained_on: str) -> bool:
    """Whether this root is (one of) the data.path the checkpoint trained on, compared as folders (a preset's
    relative path is the repo root's): there, episodes the run made are made again the same (seeded by
    train.seed, data.generated_*: fixed on a resume), as a requeue onto a node whose local data.path is
    empty needs (a review: refusing them was a regression)."""
    from trainer.data.cache.location import resolve_data_path
    from trainer.data.formats.multiroot import for_root

    parts = [p.strip() for p in trained_on.split(",") if p.strip()]
    return root in {resolve_data_path(for_root(cfg, Path(p))) for p in parts}


def _cache_makeable(cfg: RunConfig, base: Path) -> None:
    """The latent cache's folder can be made where the ranks will make it (next to the episodes, or under
    data.cache_dir), or it is there already (a prepared read-only dataset: the ranks read it). A read-only
    dataset without one was the ranks' OSError after the preflight (found by a review)."""
    import os

    from trainer.data.cache.location import CACHE_DIR

    if not cfg.data.latent_cache:
        return
    where = Path(cfg.data.cache_dir).expanduser() if cfg.data.cache_dir else base
    if (where / CACHE_DIR).is_dir():
        return
    here = where
    while not here.exists() and here != here.parent:
        here = here.parent
    if not (here.is_dir() and os.access(here, os.W_OK | os.X_OK)):
        raise PreflightError(
            f"data.path={cfg.data.path}: the latent cache goes in {where / CACHE_DIR}, and {here} cannot be "
            "written (a read-only dataset?); put it elsewhere with --set data.cache_dir=DIR"
        )


def _writable_or_makeable(cfg: RunConfig, root) -> None:
    import os

    here = root
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir() or not os.access(here, os.W_OK | os.X_OK):
        raise PreflightError(
            f"data.path={cfg.data.path}: no episodes there, and {root} cannot be made or written ({here} is "
            "not a folder this user can write) to generate them; point data.path at the dataset, or at a "
            "writable folder"
        )


def _lerobot_note(cfg: RunConfig, root) -> str:
    """A LeRobot dataset: meta/ readable, cameras and action columns in info.json, codecs decodable, every
    listed episode's parquet (and, unless data.upstream_latents=read, videos) present."""
    from trainer.data.formats import lerobot
    from trainer.data.formats.furniturebench import DatasetError

    try:
        ds = lerobot.load(root)
        if not ds.episodes:
            raise DatasetError(f"{ds.episodes_file}: lists no episodes; record some with lerobot")
        cams = list(cfg.data.cameras)
        if cfg.data.upstream_latents != "read":
            lerobot.check_cameras(ds, cams)
        lerobot.parse_action_map(ds, list(cfg.data.action_map))
        for e in ds.episodes:
            index = int(e["episode_index"])
            if not ds.parquet(index).is_file():
                raise DatasetError(
                    f"{ds.parquet(index)}: episode {index}'s parquet missing ({ds.episodes_file.name} lists "
                    "it); restore it or remove the episode from meta/"
                )
            for cam in cams if cfg.data.upstream_latents != "read" else []:
                if ds.features[cam]["dtype"] == "video" and not ds.video(index, cam).is_file():
                    raise DatasetError(
                        f"{ds.video(index, cam)}: video of episode {index}, camera {cam} missing"
                    )
    except DatasetError as exc:
        raise PreflightError(str(exc)) from exc
    return f"data: {len(ds.episodes)} episode(s) of the {ds.layout} dataset {root}, cameras {', '.join(cams)}"


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


def _can_record(cfg: RunConfig, root: Path) -> None:
    """The CPU scale's LIBERO recording needs the simulator env here (trainer/sim/env.py check_platform)."""
    from trainer.sim.env import SimEnvError, check_platform

    try:
        check_platform(
            "libero",
            f"point data.path at a LeRobot LIBERO dataset, or record one at {root} on such a node first",
        )
    except SimEnvError as exc:
        raise PreflightError(
            f"data.path={cfg.data.path}: no dataset at {root} to train on, and {exc}"
        ) from None
