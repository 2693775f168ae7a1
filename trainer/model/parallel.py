"""FSDP2 for the world model: fully_shard per block and the root, mixed precision, activation checkpointing.

    model = build_model(cfg, device)                     # built (or loaded: model.pretrained), sharded
    model = shard_model(WorldModel(cfg), cfg, device)   # needs torch.distributed initialised (torchrun)
    prepare_micro_step(model, cfg, micro)                # before each micro-step's forward
    norm = clip_grad_norm(model, cfg.train.grad_clip)

Mixed precision (train.mixed_precision): auto = bf16 params / fp32 gradient reduction on CUDA, fp32 on
CPU; bf16 and fp32 force it. Sharded parameters and optimizer state stay fp32 either way. Forward inputs
are not cast (cast_forward_inputs=False, as the reference): the model mixes noise and computes timesteps
in fp32 and casts what enters its linears itself.
Gradient accumulation (bench/bench_grad_accum.py chose the defaults): gradients are reduce-scattered on
the last micro-step only (train.grad_sync=last), and with train.keep_params_gathered the parameters stay
all-gathered from the first forward to the last backward of a step (one all-gather pass per step instead
of two per micro-step, for one unsharded copy of the parameters per rank).
Per block, in torchtitan's order (torchtitan/models/llama3/infra/parallelize.py: apply_ac, then
apply_compile, then apply_fsdp): activation checkpointing wraps the block (model.activation_checkpointing,
config/perf.py: none, full, every K-th block, or op-level selective: matmul and attention outputs saved,
everything else recomputed), then torch.compile compiles the wrapped block's forward (train.compile; auto
= on for CUDA), then fully_shard. The FSDP2 hooks stay outside the compiled region, the checkpoint is
inside it (Dynamo's activation-checkpoint operator), parameter names (and so checkpoints) are unchanged,
and the blocks share one compiled graph (Dynamo inlines nn.Modules: parameters are graph inputs).
fullgraph=True: a graph break is an error, not a silent slowdown. Shapes are static per config (the packed
length is padded per config; chunk and window redraws change mask values only), so nothing recompiles
after the first micro-step (tests/test_compile_blocks.py). FSDP2: the root (embedders, heads) keeps its
parameters after forward, as torchtitan keeps its final norm and output layer; train.fsdp_prefetch=N sets
explicit forward/backward prefetching of the next N blocks (0: FSDP2's implicit prefetch, torchtitan's).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from trainer.config.perf import AcPlan, ac_plan, compile_blocks


def mixed_precision_policy(cfg, device: torch.device) -> MixedPrecisionPolicy:
    choice = cfg.train.mixed_precision
    bf16 = choice == "bf16" or (choice == "auto" and torch.device(device).type == "cuda")
    if bf16:
        return MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False
        )
    return MixedPrecisionPolicy(
        param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=False
    )


def _blocks(model: nn.Module) -> nn.ModuleList:
    blocks = model.blocks
    assert isinstance(blocks, nn.ModuleList)
    return blocks


# model.activation_checkpointing=op: the aten ops whose outputs are saved (everything else is recomputed)
SAVED_OPS = (
    "mm",
    "addmm",
    "bmm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
)


def _op_level_context():
    """torch.utils.checkpoint's selective policy: save matmul and attention outputs, recompute the rest
    (norms, RoPE, modulation, GELU: memory-bound, cheap to recompute; torchtitan's op-level SAC list)."""
    import functools

    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    save = {getattr(aten, n).default for n in SAVED_OPS if hasattr(aten, n)}
    flex = getattr(torch.ops.higher_order, "flex_attention", None)
    if flex is not None:
        save.add(flex)

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return functools.partial(create_selective_checkpoint_contexts, policy)


def apply_activation_checkpointing(model: nn.Module, plan: AcPlan | None = None) -> None:
    """Wrap the blocks `plan` names (default: every block, full) in a non-reentrant checkpoint."""
    plan = plan or AcPlan("full")
    blocks = _blocks(model)
    for i, block in enumerate(blocks):
        if not plan.wraps(i):
            continue
        kwargs = {"context_fn": _op_level_context()} if plan.mode == "op" else {}
        blocks[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **kwargs)


def apply_compile(model: nn.Module) -> None:
    """torch.compile each (checkpoint-wrapped) block's forward in place; names unchanged."""
    for block in _blocks(model):
        block.forward = torch.compile(block.forward, fullgraph=True, dynamic=False)


def set_prefetch(model: nn.Module, count: int) -> None:
    """Explicit FSDP2 prefetching: each block all-gathers the next `count` blocks (forward and backward)."""
    blocks = list(_blocks(model))
    for i, block in enumerate(blocks):
        assert isinstance(block, FSDPModule)
        block.set_modules_to_forward_prefetch(blocks[i + 1 : i + 1 + count])  # type: ignore[arg-type]
        block.set_modules_to_backward_prefetch(blocks[max(0, i - count) : i][::-1])  # type: ignore[arg-type]


def build_model(cfg, device: torch.device) -> nn.Module:
    """The model every rank trains, built and sharded (the one entry point the loop and bench/ use).

    model.pretrained unset: random init, same seed on every rank (identical weights before sharding).
    model.pretrained set: dimensions from its config.json (apply_pretrained_config: a conflicting model.*
    is an error), built on the meta device, sharded, then every rank reads only its own shards' slices
    from the safetensors files (strict: a missing/unexpected/mis-shaped tensor is an error naming it).
    The model carries `pretrained_from` (folder or None) and `pretrained_ignored` (names skipped as the
    reference skips them) for the log.
    """
    from trainer.model import WorldModel, apply_pretrained_config, load_sharded
    from trainer.recipe.draws import check_recipe

    check_recipe(cfg.recipe)
    folder = apply_pretrained_config(cfg)
    if folder is None:
        torch.manual_seed(cfg.train.seed)
        model = shard_model(WorldModel(cfg), cfg, device)
        ignored: list[str] = []
    else:
        with torch.device("meta"):
            model = WorldModel(cfg)
        model = shard_model(model, cfg, device)
        model.to_empty(device=device)
        ignored = load_sharded(model, folder)
    setattr(model, "pretrained_from", folder)  # noqa: B010 - nn.Module's typed __setattr__ rejects these
    setattr(model, "pretrained_ignored", ignored)  # noqa: B010
    return model


def shard_model(model: nn.Module, cfg, device: torch.device | str) -> nn.Module:
    """Shard `model` in place across the default process group; returns it (now an FSDPModule)."""
    if not dist.is_initialized():
        raise RuntimeError(
            "shard_model: torch.distributed is not initialised; run under torchrun (bin/train)"
        )
    device = torch.device(device)
    apply_activation_checkpointing(model, ac_plan(cfg, device.type))  # torchtitan's order: AC,
    if compile_blocks(cfg, device):
        apply_compile(model)  # compile,
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp = mixed_precision_policy(cfg, device)
    keep_gathered = cfg.train.keep_params_gathered
    for block in _blocks(model):  # then fully_shard
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=not keep_gathered)
    if cfg.train.fsdp_prefetch:
        set_prefetch(model, cfg.train.fsdp_prefetch)
    # the root holds embedders and heads; it is used last in backward, so keep it unsharded after forward
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    return model


def set_grad_sync(model: nn.Module, enabled: bool) -> None:
    """Reduce-scatter gradients in this backward (True) or accumulate them unsharded locally (False)."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)


def prepare_micro_step(model: nn.Module, cfg, micro: int) -> None:
    """Set this micro-step's gradient sync and, with keep_params_gathered, whether backward reshards."""
    last = micro == cfg.train.grad_accum - 1
    set_grad_sync(model, last or cfg.train.grad_sync == "every")
    if cfg.train.keep_params_gathered and isinstance(model, FSDPModule):
        model.set_reshard_after_backward(last)


def clip_grad_norm(model: nn.Module, max_norm: float) -> float:
    """Global gradient norm across all shards (clipped in place); returns the norm before clipping."""
    grads = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(grads, max_norm)
    if hasattr(norm, "full_tensor"):  # DTensor under FSDP2: reduce the partial norms
        norm = norm.full_tensor()
    return float(norm)
