"""What `bin/evaluate TARGET` evaluates: a plain (unsharded) model on one process, and its run config.

TARGET is one of
    RUN_DIR                      its best checkpoint (RUN_DIR/checkpoints/best, trainer/checkpoint/best.py)
                                 when it has one, else the newest complete one under RUN_DIR/checkpoints/
    RUN_DIR/checkpoints/checkpoint_step_N   that DCP checkpoint (its train_state.json holds the run config)
    a reference-layout folder    <dir>/transformer/{config.json, *.safetensors} or the transformer/ itself:
                                 the released lingbot-va-base folder, or a checkpoint's export (checkpoint.
                                 export=reference); the run config is --config (dims from its config.json)
At full scale a reference-layout folder with stand-in encoders in the run config is refused before its
weights are read (trainer/config/standins.py: ConfigError, exit 2; data.allow_stand_in_encoders=true runs
it, announced). A DCP checkpoint is read without a process group (torch.distributed.checkpoint's
single-process load) into a plain WorldModel: the FSDP2-wrapped training model cannot run inference (its
parameters are DTensors).
"""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import torch

from trainer.checkpoint.layout import FREE_DATA_KEYS, MARKER, TRAIN_STATE, damage, scan
from trainer.config import ConfigError, RunConfig, config_from_dict, resolve_config


class TargetError(ValueError):
    """TARGET cannot be evaluated; the message names the path and what was expected."""


def _is_checkpoint(path: Path) -> bool:
    return (path / TRAIN_STATE).is_file() and (path / MARKER).is_file()


def _reference_folder(path: Path) -> Path | None:
    for folder in (path / "transformer", path):
        if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
            return folder
    return None


def resolve_target(target: str | Path, verify: bool = True) -> tuple[str, Path]:
    """("checkpoint", dir) or ("reference", transformer dir); TargetError otherwise. `verify`: the
    checkpoint's files against its COMPLETE marker, sha256 included (a full read: off only where its
    train_state.json alone is read)."""
    check = _intact if verify else (lambda found: found)
    path = Path(target)
    if not path.is_dir():
        what = "a file, not a directory" if path.exists() else "no such directory"
        raise TargetError(f"{path}: {what} (expected a run dir, a checkpoint or a released folder)")
    if _is_checkpoint(path):
        return "checkpoint", check(path)
    if (path / "checkpoints").is_dir():
        complete, _ = scan(path / "checkpoints")
        if not complete:
            raise TargetError(f"{path}/checkpoints: no complete checkpoint (train longer, or name one)")
        best = path / "checkpoints" / "best"
        pinned = [c for c in complete if best.is_symlink() and c.path.resolve() == best.resolve()]
        if best.is_symlink() and not pinned:  # its checkpoint is damaged or gone: never another one unsaid
            raise TargetError(
                f"{best} points at {best.resolve()}, which is not a complete checkpoint (damaged or "
                f"removed); name the one to use, e.g. {complete[-1].path}"
            )
        return "checkpoint", check((pinned or complete)[-1].path)
    folder = _reference_folder(path)
    if folder is not None:
        return "reference", folder
    raise TargetError(
        f"{path}: neither a run dir (checkpoints/), a checkpoint ({TRAIN_STATE} + {MARKER}) nor a "
        "reference-layout folder (transformer/config.json + *.safetensors)"
    )


def _intact(path: Path) -> Path:
    """`path` when its files match its COMPLETE marker, sizes and sha256 (what a resume checks too): a
    damaged checkpoint would otherwise load into NaN scores, or a model that serves wrong actions."""
    try:
        step = int(json.loads((path / TRAIN_STATE).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TargetError(f"{path / TRAIN_STATE}: unreadable or without a 'step' entry ({exc})") from None
    problem = damage(path, step, checksums=True)
    if problem:
        raise TargetError(f"{path}: damaged: {problem}; name another checkpoint")
    return path


def checkpoint_config(path: Path) -> RunConfig:
    source = path / TRAIN_STATE
    try:
        tree = json.loads(source.read_text())["config"]
    except (OSError, ValueError, KeyError) as exc:
        raise TargetError(f"{source}: unreadable or without a 'config' entry ({exc})") from exc
    try:
        cfg = config_from_dict(tree, str(source))
    except ConfigError as exc:
        raise TargetError(str(exc)) from exc
    cfg.model.pretrained = ""  # the checkpoint's weights replace any warm start
    return cfg


SCALE_KEYS = ("dim", "depth", "heads", "ffn_dim", "latent_size")  # model.* keys a cpu_scale block sets


def check_named_config(target: str | Path, named: str | None, cpu_scale: bool | None = None) -> None:
    """--config and --cpu-scale/--full-scale name the run config a reference-layout folder is loaded with; a
    checkpoint carries its own (its train_state.json), which was used whatever they said. TargetError for a
    --config that names another config than the checkpoint's own, or a scale flag whose model (SCALE_KEYS of
    the checkpoint's config at that scale) is not the checkpoint's; none given, or what matches, passes."""
    if not named and cpu_scale is None:
        return
    kind, path = resolve_target(target, verify=False)  # the load verifies it: one full read, not two
    if kind != "checkpoint":
        return
    own = checkpoint_config(path)
    if named and own.name != named:
        raise TargetError(
            f"--config {named}: {path} is a checkpoint of a {own.name!r} run, which carries its own config "
            f"({path / TRAIN_STATE}); drop --config (infer.* settings go through --set)"
        )
    if cpu_scale is None:
        return
    try:
        preset = resolve_config(own.name, cpu_scale)[0].model
    except ConfigError:
        return  # a config this checkout no longer has: there is no scale to compare with
    differ = [k for k in SCALE_KEYS if getattr(preset, k) != getattr(own.model, k)]
    if differ:
        flag, scale = ("--cpu-scale", "CPU scale") if cpu_scale else ("--full-scale", "full scale")
        said = ", ".join(f"model.{k}={getattr(own.model, k)} (not {getattr(preset, k)})" for k in differ)
        raise TargetError(
            f"{flag}: {path} is a checkpoint whose model is not {own.name}'s {scale}: {said}; it carries its "
            f"own config ({path / TRAIN_STATE}): drop {flag}"
        )


def check_trained_stats(target: str | Path, normalizer, latent_stats, source: str, say) -> None:
    """The statistics an evaluation or a server derived now (the action normaliser, the stand-in latents'
    standardisation) against those a checkpoint's run trained with (its train_state.json "data_stats"):
    TargetError naming the first difference (a dataset changed since training, a --set data.* on the
    checkpoint), so a model is never scored or served with statistics it never saw. A checkpoint written
    before they were recorded is said, not refused; a reference folder has none to compare."""
    from trainer.data.normalize import stats_differ

    kind, path = resolve_target(target, verify=False)
    if kind != "checkpoint":
        return
    recorded = json.loads((path / TRAIN_STATE).read_text()).get("data_stats")
    if recorded is None:
        say(
            f"{path / TRAIN_STATE} records no data statistics (an older checkpoint): {source}'s are used, "
            "unchecked"
        )
        return
    diff = stats_differ(recorded, normalizer, latent_stats)
    if diff:
        raise TargetError(
            f"{path} was trained with other data statistics than {source} gives now ({diff}): the episodes "
            "changed since training, or a --set data.* changed them; evaluate or serve it on the data and "
            "data settings it was trained with"
        )


def load_checkpoint_model(path: Path, cfg: RunConfig):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from trainer.model import WorldModel

    model = WorldModel(cfg).eval()
    state = model.state_dict()
    try:
        with warnings.catch_warnings():  # no_dist=True is this load's intent: DCP's warning says only that
            warnings.filterwarnings(
                "ignore",
                message="torch.distributed is disabled, unavailable or uninitialized",
                category=UserWarning,
            )
            dcp.load({"train": {"model": state}}, checkpoint_id=str(path), no_dist=True)
    except (Exception, CheckpointException) as exc:  # DCP's CheckpointException is a BaseException
        raise TargetError(f"{path}: its model state does not load into the run's model ({exc})") from exc
    model.load_state_dict(state, strict=True)
    return model


def load_reference_model(folder: Path, cfg: RunConfig, sources: dict[str, str] | None = None):
    """`sources` (resolve_config's): only a model.* value the user set conflicts with the folder's
    config.json; a preset's cpu_scale dims give way (an export of a CPU-scale run was refused, its fix
    "train without model.pretrained")."""
    from trainer.model import PretrainedError, WorldModel, apply_pretrained_config, load_full

    cfg = copy.deepcopy(cfg)
    cfg.model.pretrained = str(folder)
    try:
        apply_pretrained_config(cfg, sources)
        model = WorldModel(cfg).eval()
        load_full(model, folder)  # strict: a missing or misshapen tensor raises, naming it
    except PretrainedError as exc:
        raise TargetError(str(exc)) from exc
    return model.float(), cfg


def load_model(
    target: str | Path,
    cfg_for_reference: RunConfig | None,
    full_scale: bool = False,
    say=print,
    resolved: tuple[str, Path] | None = None,
    sources: dict[str, str] | None = None,
):
    """(model fp32 on CPU, cfg, description) for TARGET (see the module docstring). `full_scale`: the run
    config is a preset's full scale, where the released weights never get stand-in inputs unannounced.
    `resolved`: resolve_target(TARGET) as the caller already made it (the checkpoint its outputs name)."""
    kind, path = resolved or resolve_target(target)
    if kind == "checkpoint":
        cfg = checkpoint_config(path)
        return load_checkpoint_model(path, cfg).float(), cfg, f"checkpoint {path}"
    if cfg_for_reference is None:
        raise TargetError(f"{path}: a reference-layout folder needs a run config (--config)")
    from trainer.config.released import PretrainedError, apply_pretrained_config
    from trainer.config.standins import check_stand_ins

    dims = copy.deepcopy(cfg_for_reference)  # the folder's config.json dimensions: judged before any weight
    dims.model.pretrained = str(path)
    try:
        apply_pretrained_config(dims, {})  # its dimensions, whatever the run config says (judged later)
    except PretrainedError as exc:
        raise TargetError(str(exc)) from exc
    check_stand_ins(dims, True, full_scale, str(Path(target)), say)
    model, cfg = load_reference_model(path, cfg_for_reference, sources)
    return model, cfg, f"reference-layout weights {path}"


# model.* keys a loaded model reads at run time; every other one is its shape, fixed by TARGET
RUNTIME_MODEL_KEYS = frozenset({"model.attention", "model.attn_block", "model.activation_checkpointing"})


# data.* keys a checkpoint takes from the command line: where its data and cache are (a resume's free keys),
# and where the encoder weights sit on this machine (a review: they were refused)
CHECKPOINT_DATA_KEYS = (*FREE_DATA_KEYS, "vae_path", "text_encoder", "tokenizer")


def apply_sets(cfg: RunConfig, sets: list[str], what: str, checkpoint: bool = False) -> RunConfig:
    """The loaded model's config with the command's --set values (judged by the config's rules); TargetError
    for a model.* one the loaded model cannot follow: its shape is TARGET's own (a checkpoint's
    train_state.json, a folder's config.json), and `--set model.depth=8` was dropped unsaid. On a
    `checkpoint`, a data.* one that changes what the data is (not where: FREE_DATA_KEYS) too: cameras
    swapped, a held-out split that holds training episodes, other statistics (found by a review)."""
    from trainer.config import apply_overrides, check_config, parse_set
    from trainer.config.rules import value_of

    wanted = parse_set(list(sets))
    changed = copy.deepcopy(cfg)
    apply_overrides(changed, wanted, "--set")
    for key in wanted:
        fixed_data = (
            checkpoint and key.startswith("data.") and key.split(".", 1)[1] not in CHECKPOINT_DATA_KEYS
        )
        if fixed_data and value_of(changed, key) != value_of(cfg, key):
            raise TargetError(
                f"--set {key}={value_of(changed, key)!r}: {what} was trained with {key}="
                f"{value_of(cfg, key)!r}, and is evaluated and served with its own data settings; drop that "
                f"--set (of data.*, only {', '.join(f'data.{k}' for k in CHECKPOINT_DATA_KEYS)} apply to a "
                "checkpoint)"
            )
        if key.startswith("model.") and key not in RUNTIME_MODEL_KEYS:
            if value_of(changed, key) != value_of(cfg, key):
                raise TargetError(
                    f"--set {key}={value_of(changed, key)!r}: the model is {what}'s own ({key}="
                    f"{value_of(cfg, key)!r}); drop that --set (of model.*, only "
                    f"{', '.join(sorted(RUNTIME_MODEL_KEYS))} apply to a loaded model)"
                )
    check_config(changed)
    return changed


def pick_device(name: str) -> torch.device:
    """--device: auto, cpu, cuda or cuda:N; TargetError (one line, before any load) for one not here."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise TargetError(f"--device {name}: not a device here; use auto, cpu, cuda or cuda:N")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise TargetError(
            f"--device {name}: this node has {torch.cuda.device_count()} CUDA GPUs; use --device cpu or auto"
        )
    return dev
