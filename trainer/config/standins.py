"""The released transformer is never fed stand-in inputs unannounced: the one rule, for bin/train (and its
--plan), bin/evaluate and bin/serve.

The released LingBot-VA transformer was trained on Wan2.2 VAE latents and umT5 prompt embeddings. Fed the
weights-free stand-ins instead (data.encoder patch_mean, data.text_encoder ""), every action it gives is
meaningless while every shape is right: a silent wrong result. So at full scale a run whose model.pretrained
is set, and an evaluation or a server of a reference-layout folder (the released weights or an export), is
refused when either encoder is a stand-in: one line naming the setting to fix (a ConfigError: exit 2). So is
the released architecture at any scale (a released folder's config.json dimensions, e.g. a CPU machine's
cpu_scale block with --set model.pretrained=models/lingbot-va-base, or bin/serve of the released folder on a
node that sees no GPU): the scale is where it runs, not what the weights were trained on. The only way past
is data.allow_stand_in_encoders=true: `banner` then announces it (`!!!` lines) and the run records it
(summary.json data.allow_stand_in_encoders). The CPU-scale variants (`cpu_scale:`: random weights, or a tiny
folder under test) keep the stand-ins, announced where they are used.

    stand_ins(cfg)                                   # the stand-in settings, e.g. ["data.encoder=patch_mean"]
    refusal(cfg, released, full_scale, weights)      # the one line, or None
    check_stand_ins(cfg, released, full_scale, weights, say)   # ConfigError, or the banner said; None

No torch, no file read: the launcher judges it on a login node.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePath

from trainer.config.schema import ConfigError, RunConfig

ALLOW = "data.allow_stand_in_encoders"
# The released transformer's (dim, heads, depth): its config.json (tests/fixtures/released_layout.json:
# 24 heads x 128, 30 layers); a folder of these dimensions holds the released weights or a fine-tune of them.
RELEASED_DIMS = (3072, 24, 30)


def released_architecture(cfg: RunConfig) -> bool:
    """Whether cfg's transformer has the released dimensions (after a pretrained folder's config.json)."""
    return (cfg.model.dim, cfg.model.heads, cfg.model.depth) == RELEASED_DIMS


def stand_ins(cfg: RunConfig) -> list[str]:
    """The encoder settings of cfg that are weights-free stand-ins (empty: both encoders are real)."""
    found = []
    if cfg.data.encoder == "patch_mean":
        found.append("data.encoder=patch_mean")
    if not cfg.data.text_encoder:
        found.append('data.text_encoder="" (hashed words)')
    return found


def _fix(cfg: RunConfig, weights: str) -> str:
    root = PurePath(weights) if weights else PurePath("<the released folder>")
    if root.name == "transformer":
        root = root.parent
    sets = []
    if cfg.data.encoder == "patch_mean":
        sets.append(f"data.encoder=wan_vae data.vae_path={root / 'vae'}")
    if not cfg.data.text_encoder:
        sets.append(f"data.text_encoder={root / 'text_encoder'}")
    return f"set {' '.join(sets)} (the full-scale presets' defaults: the released folder's own encoders)"


def refusal(cfg: RunConfig, released: bool, full_scale: bool, weights: str = "") -> str | None:
    """The refusal line when the released transformer (`released`: model.pretrained set, or a reference-
    layout folder `weights` evaluated or served) would get stand-in inputs at full scale; else None."""
    found = stand_ins(cfg)
    judged = full_scale or released_architecture(cfg)
    if not (released and judged and found) or getattr(cfg.data, "allow_stand_in_encoders", False):
        return None
    where = weights or cfg.model.pretrained
    return (
        f"{' and '.join(found)}: weights-free stand-in input(s) for the released transformer ({where}), "
        f"whose every action would then be meaningless; {_fix(cfg, where)}, or --set {ALLOW}=true to run "
        "with the stand-ins anyway (announced, recorded)"
    )


def check_stand_ins(
    cfg: RunConfig, released: bool, full_scale: bool, weights: str = "", say: Callable[[str], None] = print
) -> None:
    """ConfigError with `refusal`'s line; with the override in force, the banner through `say`."""
    line = refusal(cfg, released, full_scale, weights)
    if line is not None:
        raise ConfigError(line)
    found = stand_ins(cfg)
    if released and (full_scale or released_architecture(cfg)) and found:  # allowed: never silent
        where = weights or cfg.model.pretrained
        say("!" * 100)
        say(f"!!! STAND-IN INPUTS FOR THE RELEASED TRANSFORMER ({where}): {', '.join(found)}")
        say(f"!!! {ALLOW}=true: its actions are not the released model's; for a smoke test only")
        say("!" * 100)
