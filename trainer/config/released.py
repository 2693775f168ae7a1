"""A released checkpoint's config.json <-> ModelConfig, without torch: the launcher takes the model's
dimensions from `model.pretrained` before any rank starts (trainer/model/weights.py reads the tensors).

    apply_pretrained_config(cfg, sources)  # dims from config.json, in place; a conflicting model.* value
                                           # the user set is PretrainedConflict (exit 2)
    resolve_transformer_dir(path)          # DIR, DIR/transformer or checkpoint_step_N/transformer
    model_config_json(cfg.model)           # the released config.json fields (what export writes)

Errors are PretrainedError naming the file and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainer.config.load import user_set

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
INDEX_NAME = "diffusion_pytorch_model.safetensors.index.json"
CLASS_NAME = "WanTransformer3DModel"


class PretrainedError(ValueError):
    """A pretrained folder that cannot be used as asked; the message names the file/tensor and the fix."""


class PretrainedConflict(PretrainedError):
    """A model.* value the user set differs from the folder's config.json: a config error (exit 2)."""


def model_config_json(m) -> dict:
    """The released config.json fields for ModelConfig `m` (what export writes)."""
    return {
        "_class_name": CLASS_NAME,
        "patch_size": [m.patch_t, m.patch, m.patch],
        "num_attention_heads": m.heads,
        "attention_head_dim": m.dim // m.heads,
        "in_channels": m.latent_channels,
        "out_channels": m.latent_channels,
        "action_dim": m.action_dim,
        "text_dim": m.text_dim,
        "freq_dim": m.freq_dim,
        "ffn_dim": m.ffn_dim,
        "num_layers": m.depth,
        "cross_attn_norm": m.cross_attn_norm,
        "eps": m.eps,
        "rope_max_seq_len": m.rope_max_seq_len,
        "pos_embed_seq_len": None,
        "attn_mode": "torch",
    }


def fields_from_config_json(conf: dict, source: Path) -> dict:
    """config.json -> {ModelConfig field: value}; raises PretrainedError on missing/unsupported values."""
    try:
        patch = list(conf["patch_size"])
        heads, head_dim = int(conf["num_attention_heads"]), int(conf["attention_head_dim"])
        if conf["in_channels"] != conf["out_channels"]:
            raise PretrainedError(
                f"{source}: in_channels {conf['in_channels']} != out_channels {conf['out_channels']}; "
                "LingBot-VA predicts the velocity of its own input latents, they must be equal"
            )
        if len(patch) != 3 or patch[1] != patch[2]:
            raise PretrainedError(f"{source}: patch_size {patch}: expected [t, p, p]")
        return {
            "dim": heads * head_dim,
            "heads": heads,
            "depth": int(conf["num_layers"]),
            "ffn_dim": int(conf["ffn_dim"]),
            "text_dim": int(conf["text_dim"]),
            "freq_dim": int(conf["freq_dim"]),
            "cross_attn_norm": bool(conf["cross_attn_norm"]),
            "eps": float(conf["eps"]),
            "rope_max_seq_len": int(conf["rope_max_seq_len"]),
            "latent_channels": int(conf["in_channels"]),
            "patch_t": int(patch[0]),
            "patch": int(patch[1]),
            "action_dim": int(conf["action_dim"]),
        }
    except KeyError as exc:
        raise PretrainedError(
            f"{source}: missing key {exc.args[0]!r} (not a LingBot-VA transformer config)"
        ) from exc
    except (TypeError, ValueError) as exc:
        if isinstance(exc, PretrainedError):
            raise
        raise PretrainedError(f"{source}: bad value: {exc}") from exc


def resolve_transformer_dir(path: str | Path) -> Path:
    """The folder holding config.json + safetensors: `path` itself or `path`/transformer.

    A relative `path` is relative to the repository root (as data.path is)."""
    root = Path(path).expanduser()
    if not root.is_absolute():
        from provision.paths import repo_root

        root = repo_root() / root
    for candidate in (root, root / "transformer"):
        if (candidate / CONFIG_NAME).is_file() and (
            (candidate / WEIGHTS_NAME).is_file() or (candidate / INDEX_NAME).is_file()
        ):
            return candidate
    if not root.exists():
        raise PretrainedError(
            f"model.pretrained={path}: no such directory ({root}); download robbyant/lingbot-va-base there "
            "(see README, 'Pretrained weights') or set model.pretrained to the folder you have"
        )
    raise PretrainedError(
        f"model.pretrained={path}: neither it nor {root / 'transformer'} holds {CONFIG_NAME} and "
        f"{WEIGHTS_NAME} (or {INDEX_NAME}); point it at the released model folder, its transformer/, or a "
        "reference checkpoint_step_N/"
    )


def read_config_json(folder: Path) -> dict:
    path = folder / CONFIG_NAME
    try:
        conf = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PretrainedError(f"{path}: unreadable: {exc}") from exc
    if not isinstance(conf, dict):
        raise PretrainedError(f"{path}: expected a JSON object")
    return conf


def apply_pretrained_config(cfg, sources: dict[str, str] | None = None) -> Path | None:
    """With model.pretrained set: take the dimensions from its config.json (in place); returns the folder.

    `sources` (trainer.config.resolve_config: where each value came from; the launcher passes it): only a
    value the user set (--set, or the config file itself, not its cpu_scale block) that differs from
    config.json is a conflict, PretrainedConflict naming both (exit 2). Without `sources` (a rank reading
    the launcher's resolved config.json, tests, bench): a value that differs from config.json and from
    the ModelConfig default is a conflict. Any other value gives way to config.json.
    """
    if not cfg.model.pretrained:
        return None
    folder = resolve_transformer_dir(cfg.model.pretrained)
    wanted = fields_from_config_json(read_config_json(folder), folder / CONFIG_NAME)
    defaults = type(cfg.model)()

    def chosen(key: str) -> bool:
        if sources is not None:
            return user_set(sources.get(f"model.{key}"))
        return getattr(cfg.model, key) != getattr(defaults, key)

    conflicts = [
        f"{(sources or {}).get(f'model.{key}', 'config')} sets model.{key}={getattr(cfg.model, key)!r} but "
        f"{folder / CONFIG_NAME} says {value!r}"
        for key, value in wanted.items()
        if getattr(cfg.model, key) != value and chosen(key)
    ]
    if conflicts:
        raise PretrainedConflict(
            "model.pretrained fixes the model's dimensions: "
            + "; ".join(conflicts)
            + " (drop those model.* settings, or train without model.pretrained)"
        )
    for key, value in wanted.items():
        setattr(cfg.model, key, value)
    return folder
