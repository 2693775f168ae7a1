"""The one table of rules for RunConfig values that can be judged without data or weights.

Every field of RunConfig (trainer/config/schema.py) has an entry, keyed by its dotted name:
    Rule(allowed, ok, bad)   ok(value, cfg) says whether the value is allowed; `allowed` is what the error
                             says; `bad` is a --set value that breaks the rule (tests/test_config_rules.py
                             walks every one). ok=None: the field's type alone judges it (a bool).
    Free(why)                no value is judgeable here; `why` says why, and where it is judged (the
                             preflight, when it needs the data or the weights: exit 3)

    problems = violations(cfg, sources)    # [one line per broken rule], in field order
    check(cfg, sources)                    # ConfigError with the first one (load.py calls it)

The launcher checks a config with this table before anything else (exit 2, nothing written) and a rank
checks its config.json with the same table (trainer.config.check): one table, no second copy. The line
names where the value came from (`sources`: "--set", the config file, its cpu_scale block), the key, the
value and what is allowed. A type error (`train.steps=many`) is judged earlier, by the coercion in
trainer/config/load.py, with a line of the same shape.
"""

from __future__ import annotations

import re
from typing import Any

from trainer.config.rulekinds import (
    BOOL,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    Free,
    Rule,
    _non_negative,
    _one_of,
    _positive,
    judged,
    value_of,
)
from trainer.config.schema import ConfigError, RunConfig
from trainer.config.simrules import sim_ok, sim_tasks_ok
from trainer.sim import suites  # LIBERO's suites (stdlib only: no torch)

__all__ = ["Free", "Rule", "RULES", "check", "value_of", "violations"]

# Datasets the loader reads: FurnitureBench episodes in their published .pkl format (trainer/data/).
DATASETS = ("furniture_train", "libero", "robotwin")
# FurnitureBench's camera views (trainer/data/formats/furniturebench.py CAMERAS must equal this; a test
# checks).
CAMERA_NAMES = ("color_image1", "color_image2", "color_image3")
ATTENTION = ("auto", "flex", "sdpa")
ENCODERS = ("patch_mean", "wan_vae")
# data.normalize: fitted to the training episodes, fixed in the config, or the dataset's own statistics
NORMALIZE = ("fit", "fixed", "quantile", "mean_std")
# checkpoint.best_by: the held-out metric (trainer/loop/validate.py) that picks the best checkpoint, or none
BEST_BY = ("val_action_loss", "val_latent_loss", "val_loss", "none")


def ac_value_ok(value) -> bool:
    """model.activation_checkpointing's values (trainer/config/perf.py parses them)."""
    words = ("auto", "none", "full", "op", "true", "false")
    kind, _, every = str(value).partition(":")
    return value in words or (kind == "block" and every.isdigit() and int(every) >= 1)


def rope_fits(head_dim: int) -> bool:
    """The reference's 3-axis RoPE splits head_dim as (hd - 2 (hd // 3), hd // 3, hd // 3), pairs each."""
    third = head_dim // 3
    return head_dim % 2 == 0 and third % 2 == 0


def _dim_ok(v: int, c: Any) -> bool:
    heads = c.model.heads
    return v > 0 and heads > 0 and v % heads == 0 and rope_fits(v // heads)


def _cameras_ok(v: list[str], c: Any) -> bool:
    """FurnitureBench: its view names; lerobot: feature keys (judged against info.json); auto: either, a
    LeRobot key being dotted (observation.images.<name>)."""
    fmt = c.data.format
    names_ok = fmt == "lerobot" or all(cam in CAMERA_NAMES or (fmt == "auto" and "." in cam) for cam in v)
    return 1 <= len(v) <= 3 and len(set(v)) == len(v) and all(v) and names_ok


def _slots_ok(v: list[int], c: Any) -> bool:
    n = c.model.action_dim
    return not v or (len(set(v)) == len(v) and all(0 <= s < n for s in v) and len(v) >= c.model.action_used)


def _tshape_ok(c: Any) -> bool:
    h = c.model.latent_size
    w = c.model.latent_width or h
    return len(c.data.cameras) == 3 and h % 2 == 0 and w % 2 == 0 and (3 * h // 2) % c.model.patch == 0


def _betas_ok(v: list[float], c: Any) -> bool:
    return len(v) == 2 and all(0 <= b < 1 for b in v)


_PATHS = "a path: judged where it is read (the preflight or the data preparation), not here"

RULES: dict[str, Rule | Free] = {
    "name": Free("any name: it labels the run (the config file's name by default)"),
    # model
    "model.dim": Rule(
        "> 0, a multiple of model.heads, with head dim (dim / heads) even and (head dim // 3) even "
        "(the reference's 3-axis RoPE)",
        _dim_ok,
        "100",
        ("model.heads",),
    ),
    "model.depth": POSITIVE,
    "model.heads": POSITIVE,
    "model.ffn_dim": POSITIVE,
    "model.text_dim": POSITIVE,
    "model.freq_dim": Rule("> 0 and even (cos | sin halves)", lambda v, c: v > 0 and v % 2 == 0, "7"),
    "model.cross_attn_norm": BOOL,
    "model.eps": Rule("> 0", _positive, "0"),
    "model.rope_max_seq_len": POSITIVE,
    "model.latent_channels": POSITIVE,
    "model.latent_size": Rule(
        "> 0 and a multiple of model.patch",
        lambda v, c: v > 0 and c.model.patch > 0 and v % c.model.patch == 0,
        "7",
    ),
    "model.latent_width": Rule(
        "0 (= model.latent_size) or > 0 and a multiple of model.patch",
        lambda v, c: v == 0 or (v > 0 and c.model.patch > 0 and v % c.model.patch == 0),
        "7",
    ),
    "model.patch": POSITIVE,
    "model.patch_t": Rule("1 (the released value; no other is supported)", lambda v, c: v == 1, "2"),
    "model.action_dim": POSITIVE,
    "model.action_used": Rule("in 1..model.action_dim", lambda v, c: 0 < v <= c.model.action_dim, "0"),
    "model.text_mask": BOOL,
    "model.pretrained": Free(
        "a folder: the preflight reads its config.json (exit 3 when unusable); a model.* value you set "
        "that differs from it is exit 2 (trainer/model/weights.py apply_pretrained_config)"
    ),
    "model.attn_block": POSITIVE,
    "model.attention": _one_of(*ATTENTION),
    "model.activation_checkpointing": Rule(
        "one of auto, none, full, op, block:K (K >= 1), true, false", lambda v, c: ac_value_ok(v), "nope"
    ),
    # recipe
    "recipe.num_train_timesteps": POSITIVE,
    "recipe.video_shift": Rule("> 0 (the scheduler's SNR shift)", _positive, "-5"),
    "recipe.action_shift": Rule("> 0 (the scheduler's SNR shift)", _positive, "0"),
    "recipe.loss_weighting": _one_of("reference", "none"),
    "recipe.sigma_per": _one_of("frame", "sample_frame"),
    "recipe.noisy_history_prob": FRACTION,
    "recipe.noisy_history_min": Rule(
        "in 0..recipe.noisy_history_max", lambda v, c: 0 <= v <= c.recipe.noisy_history_max, "-0.5"
    ),
    "recipe.noisy_history_max": FRACTION,
    "recipe.chunk_min": Rule("in 1..recipe.chunk_max", lambda v, c: 1 <= v <= c.recipe.chunk_max, "0"),
    "recipe.chunk_max": POSITIVE,
    "recipe.window_min": Rule("in 0..recipe.window_max", lambda v, c: 0 <= v <= c.recipe.window_max, "-1"),
    "recipe.window_max": POSITIVE,
    "recipe.text_dropout": FRACTION,
    "recipe.action_clip": POSITIVE,
    "recipe.action_rope": _one_of("reference", "aligned"),
    # data
    "data.dataset": _one_of(*DATASETS),
    "data.path": Rule(
        "a non-empty path (" + _PATHS + "); several, comma-separated, only with data.format lerobot",
        lambda v, c: bool(v.strip()) and ("," not in v or c.data.format == "lerobot"),
        "",
    ),
    "data.generate_if_missing": BOOL,
    "data.generated_episodes": POSITIVE,
    "data.generated_length": POSITIVE,
    "data.generated_tasks": Rule(
        "empty (every task with a scripted expert) or comma-separated task numbers, e.g. 0,8 (the LIBERO "
        "recorder refuses a task without an expert: trainer/data/formats/libero_record.py)",
        lambda v, c: not v.strip() or all(p.strip().isdigit() for p in v.split(",")),
        "drawer",
    ),
    "data.task": Free(
        "a furniture name: judged against the episodes found (trainer/data/formats/discovery.py)"
    ),
    "data.cameras": Rule(
        "1-3 distinct names: of "
        + ", ".join(CAMERA_NAMES)
        + " (data.format furniturebench), LeRobot feature keys (lerobot; dotted ones under auto); which of "
        "them the files have is judged with the data",
        _cameras_ok,
        "[nope]",
    ),
    "data.include_failed": BOOL,
    "data.prompt": Free("any text: the instruction embedded for every clip"),
    "data.frames": POSITIVE,
    "data.actions_per_frame": Rule(
        "> 0 and a multiple of data.actions_per_video_frame (the quotient is the encoder's temporal factor)",
        lambda v, c: v > 0 and c.data.actions_per_video_frame > 0 and v % c.data.actions_per_video_frame == 0,
        "0",
    ),
    "data.actions_per_video_frame": POSITIVE,
    "data.layout": Rule(
        "side_by_side, or tshape (3 cameras; the per-view latent height and width even, and 3/2 x the "
        "height a multiple of model.patch; trainer/data/encoding/views.py)",
        lambda v, c: v == "side_by_side" or (v == "tshape" and _tshape_ok(c)),
        "nope",
    ),
    "data.relative_poses": Rule(
        "[] or distinct start columns >= 0 of 7-wide poses (x y z qx qy qz qw) in the data.action_map order",
        lambda v, c: all(isinstance(x, int) and x >= 0 for x in v) and len(set(v)) == len(v),
        "[-1]",
    ),
    "data.encoder": Rule(
        "one of " + ", ".join(ENCODERS) + " (wan_vae needs data.vae_path)",
        lambda v, c: v in ENCODERS and (v != "wan_vae" or bool(c.data.vae_path)),
        "nope",
    ),
    "data.vae_path": Free(_PATHS),
    "data.text_encoder": Free(_PATHS),
    "data.tokenizer": Free(_PATHS),
    "data.text_length": POSITIVE,
    "data.latent_cache": BOOL,
    "data.cache_dir": Free(_PATHS),
    "data.val_episodes": Rule(
        "0 (off), a whole count >= 1 or a fraction in (0, 1) of the episodes (trainer/data/split.py)",
        lambda v, c: v == 0 or 0 < v < 1 or (v >= 1 and float(v).is_integer()),
        "1.5",
    ),
    "data.format": _one_of("auto", "furniturebench", "lerobot"),
    "data.action_map": Rule(
        "a non-empty list of LeRobot columns or slices (key, key[i], key[i:j]; judged against info.json)",
        lambda v, c: bool(v) and all(x.strip() for x in v),
        "[]",
    ),
    "data.action_slots": Rule(
        "[] (trainer/recipe/batch.py ACTION_SLOTS) or distinct channels in 0..model.action_dim-1, at least "
        "model.action_used of them",
        _slots_ok,
        "[99]",
    ),
    "data.normalize": Rule(
        "one of fit, fixed, quantile, mean_std (fixed needs data.norm_q01 and data.norm_q99)",
        lambda v, c: v in NORMALIZE and (v != "fixed" or bool(c.data.norm_q01 and c.data.norm_q99)),
        "nope",
    ),
    "data.norm_q01": Rule(
        "[] or model.action_dim numbers (q01 per channel, slot order)",
        lambda v, c: len(v) in (0, c.model.action_dim),
        "[0.5]",
    ),
    "data.norm_q99": Rule(
        "[] or model.action_dim numbers (q99 per channel, slot order), each >= its data.norm_q01",
        lambda v, c: (
            len(v) in (0, c.model.action_dim)
            and (
                not v
                or not c.data.norm_q01
                or all(hi >= lo for lo, hi in zip(c.data.norm_q01, v, strict=False))
            )
        ),
        "[0.5]",
    ),
    "data.allow_stand_in_encoders": BOOL,
    "data.upstream_latents": _one_of("off", "write", "read"),
    # train
    "train.steps": POSITIVE,
    "train.grad_accum": POSITIVE,
    "train.batch_size": POSITIVE,
    "train.lr": Rule("> 0 (the AdamW learning rate)", _positive, "-1"),
    "train.warmup_steps": NON_NEGATIVE,
    "train.weight_decay": NON_NEGATIVE,
    "train.grad_clip": Rule(">= 0 (0: no clipping)", _non_negative, "-1"),
    "train.betas": Rule("two values in [0, 1)", _betas_ok, "[0.9, 1.5]"),
    "train.adam_eps": POSITIVE,
    "train.seed": Rule("in 0..2**32-1", lambda v, c: 0 <= v < 2**32, "-1"),
    "train.grad_sync": _one_of("last", "every"),
    "train.keep_params_gathered": BOOL,
    "train.mixed_precision": _one_of("auto", "bf16", "fp32"),
    "train.log_every": POSITIVE,
    "train.compile": _one_of("auto", "true", "false"),
    "train.data_path": _one_of("auto", "inline", "prefetch"),
    "train.optimizer": _one_of("auto", "fused", "foreach", "for_loop"),
    "train.fsdp_prefetch": NON_NEGATIVE,
    "train.nonfinite": _one_of("stop", "skip"),
    "train.nonfinite_max_skips": Rule(
        ">= 1 (consecutive skipped steps before stopping)", lambda v, c: v >= 1, "0"
    ),
    "train.grad_spike_factor": Rule(">= 0 (0: no spike warnings)", _non_negative, "-1"),
    # checkpoint
    "checkpoint.every": POSITIVE,
    "checkpoint.keep": POSITIVE,
    "checkpoint.export_safetensors": BOOL,
    "checkpoint.export": _one_of("none", "reference"),
    "checkpoint.async_save": BOOL,
    "checkpoint.skip_space_check": BOOL,
    "checkpoint.validate": BOOL,
    "checkpoint.best_by": _one_of(*BEST_BY),
    # eval (the simulator evaluation during training: trainer/launcher/simeval.py)
    "eval.sim": Rule(
        "one of none, libero (libero: a run LIBERO's client loop drives: trainer/sim/suites.py check_served)",
        sim_ok,
        "nope",
    ),
    "eval.sim_every": Rule(
        "> 0 and, with eval.sim set, a multiple of checkpoint.every (only saved steps can be evaluated)",
        lambda v, c: v > 0 and (c.eval.sim == "none" or v % c.checkpoint.every == 0),
        "0",
    ),
    "eval.sim_suite": _one_of(*suites.SUITES),
    "eval.sim_tasks": Rule(
        "all, or task numbers and ranges such as 0-2,5 within eval.sim_suite's tasks",
        sim_tasks_ok,
        "x",
        ("eval.sim_suite",),
    ),
    "eval.sim_episodes": POSITIVE,
    "eval.sim_max_steps": POSITIVE,
    "eval.sim_workers": Rule(">= 0 (0: bin/evaluate's default)", _non_negative, "-1"),
    "eval.sim_device": Rule(
        "cpu or cuda:K (a GPU index the ranks do not use)",
        lambda v, c: re.fullmatch(r"cpu|cuda:\d+", str(v)) is not None,
        "gpu",
    ),
    "eval.sim_wait_s": NON_NEGATIVE,
    "eval.best_by": Rule(
        "none, or sim with eval.sim set (the best checkpoint by simulator success rate)",
        lambda v, c: v == "none" or (v == "sim" and c.eval.sim != "none"),
        "sim",
    ),
    # hang (the launcher's stall detector; the backend's timeout must outlast its limits)
    "hang.policy": _one_of("auto", "fail", "requeue"),
    "hang.step_factor": Rule(">= 2 (a multiple of the median step time)", lambda v, c: v >= 2, "1"),
    "hang.floor_s": POSITIVE,
    "hang.start_s": POSITIVE,
    "hang.phase_s": POSITIVE,
    "hang.warm_up_steps": NON_NEGATIVE,
    # The backend's timeout bounds every phase, not only a step: the other ranks wait in a collective
    # while one saves or evaluates, so a save or an evaluation longer than it fails in the backend.
    "hang.collective_timeout_s": Rule(
        "longer than max(hang.floor_s, hang.start_s, hang.phase_s) / 0.9, so that the stall detector speaks "
        "before the backend's timeout (raise it or lower those)",
        lambda v, c: v * 0.9 > max(c.hang.floor_s, c.hang.start_s, c.hang.phase_s),
        "60",
    ),
    # infer (trainer/sampling/: the reference's sampling settings)
    "infer.frames_per_chunk": POSITIVE,
    "infer.window": Rule(">= 2 (the KV cache keeps window // 2 chunks)", lambda v, c: v >= 2, "1"),
    "infer.video_steps": POSITIVE,
    "infer.action_steps": POSITIVE,
    "infer.video_shift": POSITIVE,
    "infer.action_shift": POSITIVE,
    "infer.guidance": Rule(">= 1 (1: no classifier-free guidance)", lambda v, c: v >= 1, "0.5"),
    "infer.action_guidance": Rule(">= 1 (1: no classifier-free guidance)", lambda v, c: v >= 1, "0.5"),
    "infer.video_exec_step": Rule(
        "-1 (every video step) or 1..infer.video_steps",
        lambda v, c: v == -1 or 1 <= v <= c.infer.video_steps,
        "0",
    ),
    "infer.kv_cache": BOOL,
    # plan (trainer/plan/: the preflight's memory check on a GPU node)
    "plan.margin": Rule("in [0, 1) (the share of GPU memory kept free)", lambda v, c: 0 <= v < 1, "1"),
    "plan.allow_overfit": BOOL,
    # profile
    "profile.enabled": BOOL,
    "profile.wait": NON_NEGATIVE,
    "profile.warmup": NON_NEGATIVE,
    "profile.active": POSITIVE,
    "profile.start_step": POSITIVE,
    # log
    "log.tensorboard": BOOL,
    "log.wandb": BOOL,
}


def violations(cfg: RunConfig, sources: dict[str, str] | None = None) -> list[str]:
    """One line per value that breaks its rule: where it came from, the key, the value, what is allowed.
    Values set on the command line come first, then the config file's, then the rest: when a value breaks
    a rule that relates it to another (model.dim and model.heads), the one the user just set is named."""
    problems = [
        broken
        for key, rule in RULES.items()
        if isinstance(rule, Rule) and (broken := judged(key, rule, cfg, sources)) is not None
    ]
    return [line for _, line in sorted(problems, key=lambda p: p[0])]


def check(cfg: RunConfig, sources: dict[str, str] | None = None) -> None:
    problems = violations(cfg, sources)
    if problems:
        raise ConfigError(problems[0])
