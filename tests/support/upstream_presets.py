"""Writes tests/fixtures/upstream_presets_58c2ae5.json: upstream LingBot-VA's values for the `libero` and
`robotwin` presets, each with the file and line it was read from, and the presets' deliberate differences
with their reasons. tests/test_presets.py holds the presets against that fixture.

    python tests/support/upstream_presets.py UPSTREAM_CHECKOUT > tests/fixtures/upstream_presets_58c2ae5.json

UPSTREAM_CHECKOUT: a git clone of github.com/robbyant/lingbot-va (or its fork hewu2008/lingbot-va) holding
commit 58c2ae5; its files are read with `git show 58c2ae5:PATH`, never imported or run. A config file's
assignments (`va_libero_cfg.attn_window = 30`) are read with `ast` and their right-hand sides evaluated by
`_value` below (literals, lists, `list(range(a, b))`, `+`, `*`, unary minus, dicts: nothing else); a value
outside the configs (the grad clip in train.py, the prompt length in wan_va_server.py, the relative poses
in the dataset) is found by a regular expression, its line recorded. The fixture holds numbers and names.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from typing import Any

COMMIT = "58c2ae5bac46bd8114065bea9d7d256eb67c16c3"
VAE_SPATIAL, VAE_TEMPORAL = (
    16,
    4,
)  # the Wan2.2 VAE's factors (its config.json: scale_factor_spatial/_temporal)
CONFIGS = "wan_va/configs/"


def _value(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List | ast.Tuple):
        return [_value(x) for x in node.elts]
    if isinstance(node, ast.Dict):
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values, strict=True) if k is not None}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
        a, b = _value(node.left), _value(node.right)
        return a + b if isinstance(node.op, ast.Add) else a * b
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "list"
        and isinstance(node.args[0], ast.Call)
        and getattr(node.args[0].func, "id", "") == "range"
    ):
        return list(range(*[_value(a) for a in node.args[0].args]))
    raise ValueError(f"not a plain value: {ast.dump(node)[:80]}")


def _show(checkout: str, path: str) -> str:
    return subprocess.run(
        ["git", "-C", checkout, "show", f"{COMMIT}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def config_fields(checkout: str, name: str) -> dict[str, tuple[Any, int]]:
    """{field: (value, line)} of `<obj>.<field> = <value>` in wan_va/configs/<name>."""
    out = {}
    for node in ast.walk(ast.parse(_show(checkout, CONFIGS + name))):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute):
            try:
                out[node.targets[0].attr] = (_value(node.value), node.lineno)
            except ValueError:
                continue  # a value computed from others (inverse_used_action_channel_ids): not a setting
    return out


def found(checkout: str, path: str, pattern: str) -> tuple[re.Match[str], int]:
    for number, line in enumerate(_show(checkout, path).splitlines(), 1):
        match = re.search(pattern, line)
        if match:
            return match, number
    raise LookupError(f"{path}: no line matches {pattern!r}")


def _entry(value: Any, path: str, line: int, upstream: str, derivation: str = "") -> dict[str, Any]:
    entry = {"value": value, "file": path, "line": line, "upstream": upstream}
    return {**entry, "derivation": derivation} if derivation else entry


def preset_values(checkout: str, bench: str) -> dict[str, dict[str, Any]]:
    """{RunConfig dotted key: entry} for one benchmark (libero | robotwin), at full scale."""
    cfg_file, train_file = f"va_{bench}_cfg.py", f"va_{bench}_train_cfg.py"
    cfg, train = config_fields(checkout, cfg_file), config_fields(checkout, train_file)
    shared = config_fields(checkout, "shared_config.py")
    out: dict[str, dict[str, Any]] = {}

    def put(key: str, fields: dict, file: str, name: str, derive=None, how: str = "") -> None:
        raw, line = fields[name]
        out[key] = _entry(derive(raw) if derive else raw, CONFIGS + file, line, name, how)

    for key, name in {
        "model.action_dim": "action_dim",
        "data.actions_per_frame": "action_per_frame",
        "data.cameras": "obs_cam_keys",
        "data.action_slots": "used_action_channel_ids",
        "infer.frames_per_chunk": "frame_chunk_size",
        "infer.window": "attn_window",
        "infer.video_steps": "num_inference_steps",
        "infer.action_steps": "action_num_inference_steps",
        "infer.video_shift": "snr_shift",
        "infer.action_shift": "action_snr_shift",
        "infer.guidance": "guidance_scale",
        "infer.action_guidance": "action_guidance_scale",
        "infer.video_exec_step": "video_exec_step",
        "recipe.video_shift": "snr_shift",
        "recipe.action_shift": "action_snr_shift",
    }.items():
        put(key, cfg, cfg_file, name)
    put("model.action_used", cfg, cfg_file, "used_action_channel_ids", len, "len(used_action_channel_ids)")
    h = cfg["height"][0]
    put("model.latent_size", cfg, cfg_file, "height", lambda v: v // VAE_SPATIAL, f"height // {VAE_SPATIAL}")
    put(
        "model.latent_width",
        cfg,
        cfg_file,
        "width",
        lambda v: 0 if v == h else v // VAE_SPATIAL,
        f"width // {VAE_SPATIAL}; 0 (square) when width == height",
    )
    put(
        "data.layout",
        cfg,
        cfg_file,
        "env_type",
        lambda v: {"none": "side_by_side", "robotwin_tshape": "tshape"}[v],
        "env_type: 'none' -> side_by_side (_cat_video_latents along the width), 'robotwin_tshape' -> tshape",
    )
    put(
        "data.actions_per_video_frame",
        cfg,
        cfg_file,
        "action_per_frame",
        lambda v: v // VAE_TEMPORAL,
        f"action_per_frame // {VAE_TEMPORAL} (the VAE's temporal factor): the dataset's frame_stride",
    )
    put(
        "data.normalize",
        cfg,
        cfg_file,
        "action_norm_method",
        lambda v: {"quantiles": "fixed"}[v],
        "action_norm_method 'quantiles' with the config's own norm_stat: data.normalize fixed",
    )
    put(
        "data.norm_q01",
        cfg,
        cfg_file,
        "norm_stat",
        lambda v: [float(x) for x in v["q01"]],
        "norm_stat['q01']",
    )
    put(
        "data.norm_q99",
        cfg,
        cfg_file,
        "norm_stat",
        lambda v: [float(x) for x in v["q99"]],
        "norm_stat['q99']",
    )
    put("model.patch_t", shared, "shared_config.py", "patch_size", lambda v: v[0], "patch_size[0]")
    put("model.patch", shared, "shared_config.py", "patch_size", lambda v: v[1], "patch_size[1] (= [2])")
    for key, name in {
        "train.lr": "learning_rate",
        "train.weight_decay": "weight_decay",
        "train.warmup_steps": "warmup_steps",
        "train.batch_size": "batch_size",
        "train.grad_accum": "gradient_accumulation_steps",
        "train.steps": "num_steps",
        "checkpoint.every": "save_interval",
        "recipe.text_dropout": "cfg_prob",
    }.items():
        put(key, train, train_file, name)
    beta1, line = train["beta1"]
    out["train.betas"] = _entry([beta1, train["beta2"][0]], CONFIGS + train_file, line, "beta1, beta2")
    clip, line = found(checkout, "wan_va/train.py", r"clip_grad_norm_\(.*, ([0-9.]+)\)")
    out["train.grad_clip"] = _entry(float(clip.group(1)), "wan_va/train.py", line, "clip_grad_norm_ max norm")
    length, line = found(checkout, "wan_va/wan_va_server.py", r"max_sequence_length=(\d+)")
    out["data.text_length"] = _entry(
        int(length.group(1)), "wan_va/wan_va_server.py", line, "max_sequence_length"
    )
    dataset = "wan_va/dataset/lerobot_latent_dataset.py"
    if cfg["env_type"][0] == "robotwin_tshape":
        left, line = found(checkout, dataset, r"get_relative_pose\(action\[:, (\d*):7\]\)")
        right, _ = found(checkout, dataset, r"get_relative_pose\(action\[:, (\d+):15\]\)")
        starts = [int(left.group(1) or 0), int(right.group(1))]
        out["data.relative_poses"] = _entry(
            starts,
            dataset,
            line,
            "get_relative_pose(action[:, :7]), (action[:, 8:15])",
            "the start column of each 7-wide pose made relative",
        )
    else:
        _, line = found(checkout, dataset, r"env_type == 'robotwin_tshape'.*get_relative_pose")
        out["data.relative_poses"] = _entry(
            [], dataset, line, "get_relative_pose only for env_type robotwin_tshape"
        )
    return out


# The presets' deliberate differences from upstream: {preset: {scale: {key: reason}}}. A key listed at
# full scale is not compared with upstream (the preset's value is recorded beside the reason by the test).
EXCEPTIONS = {
    "full": {
        "data.frames": "upstream's clip is an episodes.jsonl action_config segment (start_frame..end_frame, "
        "variable length; lerobot_latent_dataset.py parse_meta); here a fixed number of latent frames",
    },
    "cpu_scale": {
        "model.latent_size": "the CPU scale shrinks the views (its aspect kept); no released weights",
        "model.latent_width": "the CPU scale shrinks the views (its aspect kept); no released weights",
        "data.normalize": "no released weights at CPU scale: statistics fitted to the test dataset "
        "(upstream's fixed ones belong to the weights trained with them)",
        "train.steps": "a short CPU run: the full scale keeps upstream's",
        "train.grad_accum": "a short CPU run: the full scale keeps upstream's",
        "train.lr": "a random-init tiny model learns at 1e-3",
        "train.warmup_steps": "a short CPU run: the full scale keeps upstream's",
        "checkpoint.every": "a short CPU run: the full scale keeps upstream's",
        "data.frames": "short test episodes: one clip of 4 latent frames",
    },
}
SEMANTICS = {
    "robotwin": {
        "data.relative_poses": "same columns, another reference row: the episode's first row here "
        "(trainer/data/poses.py), the clip's first row upstream (after act_shift); upstream's RoboTwin "
        "client adds the episode's initial pose back, so the served actions agree with its loop",
    },
}


def main(checkout: str) -> None:
    fixture = {
        "source": {
            "repository": "github.com/robbyant/lingbot-va (read from the fork "
            "github.com/hewu2008/lingbot-va)",
            "commit": COMMIT,
            "made_by": "python tests/support/upstream_presets.py UPSTREAM_CHECKOUT > "
            "tests/fixtures/upstream_presets_58c2ae5.json (ast of the config files, regular expressions "
            "elsewhere; no upstream code run or copied)",
            "vae_factors": {"spatial": VAE_SPATIAL, "temporal": VAE_TEMPORAL},
        },
        "presets": {
            bench: {
                "values": preset_values(checkout, bench),
                "exceptions": EXCEPTIONS,
                "semantics": SEMANTICS.get(bench, {}),
            }
            for bench in ("libero", "robotwin")
        },
    }
    json.dump(fixture, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
