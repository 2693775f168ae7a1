"""Released-checkpoint I/O: config.json <-> ModelConfig, strict loading (whole or per FSDP2 shard), export.

A pretrained folder is what the reference reads with `WanTransformer3DModel.from_pretrained`:
    DIR/transformer/{config.json, diffusion_pytorch_model.safetensors}    (released robbyant/lingbot-va-base)
    DIR/transformer/diffusion_pytorch_model.safetensors.index.json + -0000k-of-0000n.safetensors (sharded)
    DIR/checkpoint_step_N/transformer/...                                 (the reference trainer's save)
`model.pretrained` may name DIR, DIR/transformer, or checkpoint_step_N (resolve_transformer_dir).

    apply_pretrained_config(cfg)          # dims from config.json; a conflicting model.* value is an error
    load_full(model, folder)              # plain module: strict, every tensor checked
    load_sharded(model, folder)           # FSDP2 module (after to_empty): each rank reads only its slices
    export_reference(model, cfg, out_dir) # out_dir/transformer/{config.json, diffusion_pytorch_model...}

Strict means: every parameter of the model has a tensor of the same shape in the files and every tensor in
the files is a parameter, except names matching IGNORED_UNEXPECTED (the reference's own
`_keys_to_ignore_on_load_unexpected`). Errors are PretrainedError naming the file, the tensor and the fix.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from provision.atomic import write_atomic, write_json_atomic
from trainer.config.released import (  # noqa: F401 (re-exported: config.json is part of this folder's I/O)
    CLASS_NAME,
    CONFIG_NAME,
    INDEX_NAME,
    WEIGHTS_NAME,
    PretrainedConflict,
    PretrainedError,
    apply_pretrained_config,
    fields_from_config_json,
    model_config_json,
    read_config_json,
    resolve_transformer_dir,
)

IGNORED_UNEXPECTED = ("norm_added_q",)  # wan_va/modules/model.py _keys_to_ignore_on_load_unexpected
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def canonical_name(name: str) -> str:
    """A parameter name without activation-checkpoint / compile / FSDP wrapper prefixes."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


# -- reading tensors ---------------------------------------------------------------------------------
def weight_files(folder: Path) -> dict[str, Path]:
    """tensor name -> safetensors file holding it (single file or an index's weight_map)."""
    from safetensors import safe_open

    index = folder / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise PretrainedError(f"{index}: not a safetensors index ({exc})") from exc
        files = {name: folder / file for name, file in weight_map.items()}
        for file in set(files.values()):
            if not file.is_file():
                raise PretrainedError(f"{index}: names {file.name}, which does not exist in {folder}")
        return files
    path = folder / WEIGHTS_NAME
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict.fromkeys(f.keys(), path)
    except Exception as exc:  # safetensors raises its own error types for truncated/corrupt headers
        raise PretrainedError(f"{path}: not a readable safetensors file ({exc})") from exc


def tensor_shapes(files: dict[str, Path]) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(set(files.values())):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def _ignored(name: str) -> bool:
    return any(re.search(pattern, name) for pattern in IGNORED_UNEXPECTED)


def check_layout(
    expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], folder: Path
) -> list[str]:
    """Raise PretrainedError unless `found` (files) matches `expected` (model) strictly; returns ignored."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(n for n in set(found) - set(expected) if not _ignored(n))
    ignored = sorted(n for n in set(found) - set(expected) if _ignored(n))
    shapes = sorted(
        f"{n}: file {list(found[n])} vs model {list(expected[n])}"
        for n in set(expected) & set(found)
        if tuple(found[n]) != tuple(expected[n])
    )
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing tensor(s): {', '.join(missing[:8])}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected tensor(s): {', '.join(unexpected[:8])}")
    if shapes:
        problems.append(f"{len(shapes)} mis-shaped tensor(s): {'; '.join(shapes[:8])}")
    if problems:
        raise PretrainedError(
            f"{folder}: weights do not match the model built from {folder / CONFIG_NAME}: "
            + " | ".join(problems)
            + " (is this a LingBot-VA transformer folder, and its config.json the one it was saved with?)"
        )
    return ignored


def expected_layout(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """canonical parameter name -> global shape (works on meta, plain and FSDP2 modules)."""
    return {canonical_name(n): tuple(p.shape) for n, p in model.named_parameters()}


def load_full(model: nn.Module, folder: str | Path) -> list[str]:
    """Load a whole pretrained folder into a plain (unsharded) model, strictly; returns ignored names."""
    from safetensors import safe_open

    folder = Path(folder)
    files = weight_files(folder)
    ignored = check_layout(expected_layout(model), tensor_shapes(files), folder)
    params = {canonical_name(n): p for n, p in model.named_parameters()}
    with torch.no_grad():
        for path in sorted(set(files.values())):
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    if name in params:
                        params[name].copy_(f.get_tensor(name).to(params[name].dtype))
    return ignored


def _local_slices(param) -> tuple[torch.Tensor, list[slice]]:
    """(local tensor to fill, its slices of the global tensor) for a plain or DTensor (FSDP2) parameter."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return param.data, [slice(0, s) for s in param.shape]
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return param.to_local(), [slice(o, o + s) for o, s in zip(offset, shape, strict=True)]


def load_sharded(model: nn.Module, folder: str | Path) -> list[str]:
    """Fill an FSDP2-sharded model's (already materialised, e.g. after to_empty) local shards from the
    files: each rank reads only its slices (safetensors get_slice), no rank holds the whole model."""
    from safetensors import safe_open

    folder = Path(folder)
    files = weight_files(folder)
    ignored = check_layout(expected_layout(model), tensor_shapes(files), folder)
    by_file: dict[Path, list[tuple[str, nn.Parameter]]] = {}
    for name, param in model.named_parameters():
        by_file.setdefault(files[canonical_name(name)], []).append((canonical_name(name), param))
    with torch.no_grad():
        for path, params in sorted(by_file.items()):
            for name, param in params:
                local, slices = _local_slices(param)
                if local.numel() == 0:
                    continue
                # one open per tensor: the slice is a view of the file's mmap, and closing unmaps the pages
                # read, so mapped file pages never add up beyond one tensor's slice
                with safe_open(str(path), framework="pt") as f:
                    piece = f.get_slice(name)[tuple(slices)]
                    local.copy_(piece.to(device=local.device, dtype=local.dtype))
                    del piece
    return ignored


# -- export ------------------------------------------------------------------------------------------
def _full_state_dict(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(canonical name, full CPU tensor) one parameter at a time; a collective under FSDP2."""
    from torch.distributed.tensor import DTensor

    for name, param in model.named_parameters():
        tensor = param.full_tensor() if isinstance(param, DTensor) else param.detach()
        yield canonical_name(name), tensor.to("cpu")


def export_reference(
    model: nn.Module, cfg, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16
) -> Path | None:
    """Write out_dir/transformer/{config.json, diffusion_pytorch_model.safetensors} in the released layout
    (bf16, as the reference trainer saves), which the reference's from_pretrained loads.

    Every rank must call it (gathering the full tensors is a collective); rank 0 writes, atomically per
    file, the weights before config.json (a folder with config.json is complete). Returns the folder on
    rank 0, None elsewhere.
    """
    from safetensors.torch import save

    rank = dist.get_rank() if dist.is_initialized() else 0
    tensors = {}
    for name, tensor in _full_state_dict(model):
        if rank == 0:
            tensors[name] = tensor.to(dtype).contiguous()
        del tensor
    if rank != 0:
        return None
    folder = Path(out_dir) / "transformer"
    folder.mkdir(parents=True, exist_ok=True)
    conf = model_config_json(cfg.model)
    conf["_diffusers_version"] = _diffusers_version()
    write_atomic(folder / WEIGHTS_NAME, save(tensors, metadata={"format": "pt"}))
    write_json_atomic(folder / CONFIG_NAME, conf)
    return folder


def _diffusers_version() -> str:
    try:
        from importlib.metadata import version

        return version("diffusers")
    except Exception:
        return "0.35.0"
