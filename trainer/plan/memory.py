"""Peak memory per rank of one optimizer step, traced on the CPU: fake process group, FakeTensorMode,
a meta-built model sharded exactly as model/parallel.py shard_model shards it, and PyTorch's FSDPMemTracker.

    peak = traced_peak(cfg, world_size, target)     # {category: bytes} at the step's peak, + "total"

What is traced (the same code a rank runs: WorldModel, shard_model, prepare_micro_step, AdamW):
- Steady state: AdamW's state exists before tracking starts (one optimizer step on zero gradients,
  untracked), so the peak is that of step 2 onward, not of the first step (which allocates the moments).
- The micro-steps that differ in memory: the first, one middle one (gradients accumulate unsharded when
  train.grad_sync=last) and the last (the reduce-scatter); every other middle micro-step repeats the
  middle one. Then clip-free AdamW step (the clip's norm is a scalar per tensor).
- Mixed precision as on the target: `auto` means bf16 parameters / fp32 reduction on a GPU, fp32 on CPU.
- Attention as on the target. cpu: the backend trainer.model.attention.resolve_backend picks there (sdpa with
  the dense LingBot mask on torch 2.13). GPU: compiled FlexAttention, which never materialises the
  (L, L) score matrix. FlexAttention cannot run on the CPU build, so a stand-in op with flex's memory
  takes its place: forward allocates the output (B, H, L, d) and the fp32 log-sum-exp (B, H, L) and saves
  q, k, v, output and log-sum-exp for backward (what flex's autograd function saves); backward allocates
  flex's fp32 `delta` (B, H, L) and dq, dk, dv; the BlockMask is its eight int32 block tables.
- Depth: every block is identical and sharded on its own, so each category is affine in the depth at
  a fixed phase of the step. A model deeper than TRACE_DEPTHS[-1] is traced at the depths in
  TRACE_DEPTHS and each category is extrapolated linearly to model.depth (docs/plan.md: measured against
  a full-depth trace). Tracing 30 blocks on a 2-core CPU takes minutes; two shallow traces take seconds.
Not in the trace: the CUDA context, NCCL's buffers, the caching allocator's fragmentation, compile
workspaces. The plan's fit margin (plan.margin) stands for them.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from trainer.data.encoding import views

TRACE_DEPTHS = (2, 3)
CATEGORIES = {  # FSDPMemTracker's reference types -> the plan's names
    "SHARDED_PARAM": "sharded_params",
    "UNSHARDED_PARAM": "unsharded_params",
    "BUFFER": "buffers",
    "SHARDED_GRAD": "sharded_grads",
    "UNSHARDED_GRAD": "unsharded_grads",
    "ACT": "activations",
    "TEMP": "temporaries",
    "ALL_GATHER": "all_gather_buffers",
    "REDUCE_SCATTER": "reduce_scatter_buffers",
    "OPT": "optimizer_state",
    "INP": "inputs",
}


def target_config(cfg, target: str):
    """A copy of cfg as it runs on `target` ("cpu" or "cuda"): mixed precision, train.compile and (but
    auto on a GPU, which the plan resolves per kind: trainer/plan/choices.py) activation checkpointing
    resolved."""
    from trainer.config.perf import compile_blocks, parse_ac

    cfg = copy.deepcopy(cfg)
    if cfg.train.mixed_precision == "auto":
        cfg.train.mixed_precision = "bf16" if target == "cuda" else "fp32"
    cfg.train.compile = "true" if compile_blocks(cfg, target) else "false"  # resolved: the step predicts it
    if cfg.model.activation_checkpointing != "auto" or target != "cuda":
        cfg.model.activation_checkpointing = parse_ac(cfg.model.activation_checkpointing, target).name
    return cfg


# --- FlexAttention's memory, on the CPU -------------------------------------------------------------


class _FlexMemory(torch.autograd.Function):
    """Allocates and saves what compiled flex_attention does; its values are meaningless (trace only)."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        delta = lse.new_empty(lse.shape)  # flex's backward: rowsum(dO * O), fp32
        del delta
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@dataclass
class _BlockTables:
    tables: tuple[torch.Tensor, ...]


class FlexMemoryBackend:
    """The attention backend interface (trainer/model/attention.py) with compiled FlexAttention's memory."""

    name = "flex (memory stand-in)"

    def __init__(self, block_size: int):
        self.block_size = block_size

    def build_mask(self, mask_mod, length: int, device) -> _BlockTables:
        blocks = math.ceil(length / self.block_size)
        counts = [torch.empty(1, 1, blocks, dtype=torch.int32, device=device) for _ in range(4)]
        indices = [torch.empty(1, 1, blocks, blocks, dtype=torch.int32, device=device) for _ in range(4)]
        return _BlockTables((*counts, *indices))

    def attend(self, q, k, v, mask) -> torch.Tensor:
        return _FlexMemory.apply(q, k, v)


# --- the trace --------------------------------------------------------------------------------------


def synthetic_micro_batch(cfg, seed: int = 0) -> dict:
    """A micro-batch of the shapes the stream produces for cfg (random latents on the composed grid,
    trainer/data/encoding/views.py grid; the recipe's draws)."""
    from trainer.recipe.batch import CleanBatch
    from trainer.recipe.draws import EmptyText, draw_micro_batch

    m, d, b = cfg.model, cfg.data, cfg.train.batch_size
    f, n, text = d.frames, d.actions_per_frame, d.text_length
    hh, ww = views.grid(cfg)  # the composed views (data.layout)
    g = torch.Generator().manual_seed(seed)
    clean: CleanBatch = {
        "latents": torch.randn(b, f, m.latent_channels, hh, ww, generator=g),
        "actions": torch.zeros(b, f * n, m.action_dim),
        "action_mask": torch.ones(b, f * n, m.action_dim, dtype=torch.bool),
        "text_emb": torch.zeros(b, text, m.text_dim),
        "text_mask": torch.ones(b, text, dtype=torch.bool),
    }
    empty = EmptyText(torch.zeros(text, m.text_dim), torch.zeros(text, dtype=torch.bool))
    return dict(draw_micro_batch(cfg.recipe, clean, empty, g))


def micro_steps(grad_accum: int) -> list[int]:
    """The micro-step indices whose memory differs: first, one middle, last (deduplicated, in order)."""
    return sorted({0, min(1, grad_accum - 1), grad_accum - 1})


def make_optimizer(model, cfg, fused: bool):
    """AdamW over the trained parameters, as trainer.loop.train.build makes it."""
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=cfg.train.lr,
        betas=(cfg.train.betas[0], cfg.train.betas[1]),
        eps=cfg.train.adam_eps,
        weight_decay=cfg.train.weight_decay,
        fused=fused,
    )


def tracked_step(model, optimizer, cfg, batch: dict, tracker, steps: list[int]) -> None:
    """The micro-steps `steps` of one optimizer step and the AdamW step, inside `tracker`."""
    from trainer.model.parallel import prepare_micro_step

    with tracker:
        for i, micro in enumerate(steps):
            if i:
                tracker.reset_mod_stats()  # the tracker allows one forward per module per iteration
            prepare_micro_step(model, cfg, micro)
            out = model(batch)
            (out["loss"] / cfg.train.grad_accum).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def peak_by_category(tracker) -> dict[str, int]:
    snapshot = tracker.get_tracker_snapshot("peak")
    out = {name: 0 for name in CATEGORIES.values()}
    total = 0
    for per_device in snapshot.values():
        for key, value in per_device.items():
            name = CATEGORIES.get(getattr(key, "name", str(key)))
            if name is not None:
                out[name] += int(value)
            elif str(key) == "Total":
                total += int(value)
    out["total"] = total
    return out


def _trace_once(cfg, world_size: int, target: str) -> dict[str, int]:
    """One fake step of cfg (at its own depth) on a fake process group of world_size ranks."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from trainer.model import WorldModel
    from trainer.model.parallel import shard_model

    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    elif dist.get_world_size() != world_size:
        raise RuntimeError(
            f"a process group of {dist.get_world_size()} ranks exists; the plan needs {world_size}"
        )
    cfg = copy.deepcopy(cfg)
    cfg.train.compile = "false"  # traced eager: no compile under FakeTensorMode (memory as eager's)
    try:
        with torch.device("meta"):
            world = WorldModel(cfg)
        if target == "cuda":
            world.use_attention_backend(FlexMemoryBackend(cfg.model.attn_block), "plan: flex memory stand-in")
        model = shard_model(world, cfg, "cpu")  # the mesh must be made outside FakeTensorMode
        batch = synthetic_micro_batch(cfg)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            model.to_empty(device="cpu")
            optimizer = make_optimizer(model, cfg, fused=target == "cuda")
            for p in model.parameters():  # steady state: AdamW's moments exist before the tracked step
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            fake_batch = {k: mode.from_tensor(v) for k, v in batch.items()}
            tracker = FSDPMemTracker(model, optimizer)
            tracker.track_inputs((fake_batch,))
            tracked_step(model, optimizer, cfg, fake_batch, tracker, micro_steps(cfg.train.grad_accum))
        return peak_by_category(tracker)
    finally:
        if owns_group:
            dist.destroy_process_group()


_TRACES: dict[tuple[str, int, str], dict[str, int]] = {}


def _trace_cached(cfg, world_size: int, target: str) -> dict[str, int]:
    """_trace_once, once per (config, world size, target) in this process: plans of configs that share
    their shallow traces (another depth, AC choices, bench/gpu_matrix.py's rows) reuse them."""
    import json

    tree = cfg.to_dict()
    for name in ("compile", "data_path", "optimizer"):  # not traced: eager, fused AdamW, no data
        tree["train"].pop(name, None)
    key = (json.dumps(tree, sort_keys=True), world_size, target)
    if key not in _TRACES:
        _TRACES[key] = _trace_once(cfg, world_size, target)
    return dict(_TRACES[key])


def traced_peak(cfg, world_size: int, target: str) -> dict[str, int]:
    """Peak bytes per category on one rank (see the module docstring); "total" is the peak itself."""
    cfg = target_config(cfg, target)
    if cfg.model.activation_checkpointing == "auto":  # unresolved here: what auto falls back to (full)
        cfg.model.activation_checkpointing = "full"
    depth = cfg.model.depth
    if depth <= TRACE_DEPTHS[-1]:
        return _trace_cached(cfg, world_size, target)
    traces = []
    for d in TRACE_DEPTHS:
        shallow = copy.deepcopy(cfg)
        shallow.model.depth = d
        traces.append(_trace_cached(shallow, world_size, target))
    (d0, d1), (a, b) = TRACE_DEPTHS, traces
    return {key: max(0, round(a[key] + (b[key] - a[key]) * (depth - d0) / (d1 - d0))) for key in a}
