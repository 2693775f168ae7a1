"""One configuration's training steps on one GPU, measured against the plan: what bench/gpu_check.py
(--single) and bench/gpu_matrix.py (every row) run.

    cfg = check_config(layers, grad_accum, ["train.compile=true"])  # the cluster config, `layers` blocks
    plan, error = plan_for(cfg)        # trainer/plan/ for this GPU's kind, world size 1 (None, why: failed)
    device = init_one_gpu()            # a one-rank NCCL process group on GPU 0
    result = measure(cfg, steps, device, plan)  # per-step seconds and breakdown, MFU, peak vs plan, ...

check_config: furniture_train at full scale with model.depth=layers, random init, FlexAttention, full
activation checkpointing, bf16, then the --set overrides (YAML values, as bin/train's --set). measure:
micro-batches of the run's shapes (trainer.plan.memory.synthetic_micro_batch: the recipe's draws, so chunk
and window change every micro-batch as in training) through trainer.loop.train.train_step.
"""

from __future__ import annotations

import copy
import os
import sys
import time


def check_config(layers: int, grad_accum: int, extra: list[str] | None = None):
    import yaml

    from trainer.config import load_config

    overrides: dict[str, object] = {
        "model.pretrained": "",
        "model.depth": layers,
        "model.attention": "flex",
        "model.activation_checkpointing": "full",
        "train.mixed_precision": "bf16",
        "train.grad_accum": grad_accum,
    }
    for item in extra or []:  # --set KEY=VALUE, a YAML value as bin/train's --set reads it
        key, _, value = item.partition("=")
        overrides[key] = yaml.safe_load(value)
    return load_config("furniture_train", cpu_scale=False, overrides=overrides)


class SyntheticStream:
    """micro_batch(step, micro) of the run's shapes; the recipe's draws vary with (step, micro)."""

    def __init__(self, cfg):
        from trainer.plan.estimate import tokens_per_micro_batch
        from trainer.plan.memory import synthetic_micro_batch

        self.cfg, self._make = cfg, synthetic_micro_batch
        self.tokens_per_micro_batch = tokens_per_micro_batch(cfg)

    def micro_batch(self, step: int, micro: int) -> dict:
        return self._make(self.cfg, seed=step * 1000 + micro)


def measure(cfg, steps: int, device, plan, comm_timing: bool = True) -> dict:
    """`steps` training steps of cfg through trainer.loop.train.train_step on this process's one GPU (the
    process group exists); the result against `plan` (a Plan for this GPU's kind, or None)."""
    import torch
    from torch._dynamo.utils import counters

    from trainer.config.perf import adamw_impl, prefetch_data
    from trainer.data.prefetch import Prefetcher
    from trainer.loop.rig import Rig
    from trainer.loop.timing import StepBreakdown, install_comm_timing
    from trainer.loop.train import train_step, warmup_schedule
    from trainer.model.parallel import build_model
    from trainer.plan.estimate import mfu_at
    from trainer.plan.gpus import match_device_name
    from trainer.plan.memory import make_optimizer

    kind = match_device_name(torch.cuda.get_device_name(device))
    model = build_model(cfg, device)
    optimizer = make_optimizer(model, cfg, fused=adamw_impl(cfg, device).get("fused", False))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_schedule(cfg.train.warmup_steps))
    breakdown = StepBreakdown(device)
    if comm_timing:
        install_comm_timing(model, breakdown)
    stream = SyntheticStream(cfg)
    tokens = stream.tokens_per_micro_batch
    if prefetch_data(cfg, device):
        stream = Prefetcher(stream, cfg.train.grad_accum, pin=True)  # type: ignore[assignment]
    rig = Rig(cfg, 0, 1, device, model, optimizer, scheduler, stream, None, breakdown)  # type: ignore[arg-type]
    records, graphs_after_first = [], 0
    for step in range(1, steps + 1):
        if step == 2:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            graphs_after_first = counters["stats"]["unique_graphs"]
        t0 = time.perf_counter()
        breakdown.start_step()
        train_step(rig, step)
        torch.cuda.synchronize(device)
        record = breakdown.end_step()
        record["wall_s"] = time.perf_counter() - t0
        records.append(record)
        print(f"gpu_check: depth {cfg.model.depth} step {step}/{steps} {record['wall_s']:.3f} s", flush=True)
    if isinstance(stream, Prefetcher):
        stream.close()
    peak = torch.cuda.max_memory_allocated(device)
    steady = [r["wall_s"] for r in records[1:]] or [records[0]["wall_s"]]
    step_s = sum(steady) / len(steady)
    kind_plan = plan.kinds[0] if plan and plan.kinds else None
    predicted = kind_plan.step_s if kind_plan and kind_plan.step_s else None
    plan_peak = (kind_plan.peak_bytes if kind_plan else 0) or (plan.memory["total"] if plan else None)
    return {
        "gpu_kind": kind.name if kind else None,
        "config": {
            "depth": cfg.model.depth,
            "grad_accum": cfg.train.grad_accum,
            "tokens": tokens,
            "compile": cfg.train.compile,
            "activation_checkpointing": cfg.model.activation_checkpointing,
            "data_path": cfg.train.data_path,
            "optimizer": cfg.train.optimizer,
            "fsdp_prefetch": cfg.train.fsdp_prefetch,
        },  # fmt: skip
        "steps": records,
        "step_s_steady": step_s,
        "mfu": mfu_at(plan, kind, step_s) if kind and plan else None,
        "graphs_compiled_after_step1": counters["stats"]["unique_graphs"] - graphs_after_first,
        "graph_breaks": sum(counters["graph_break"].values()),
        "dynamo_stats": dict(counters["stats"]),
        "peak_allocated_bytes": peak,
        "plan_peak_bytes": plan_peak,
        "peak_over_plan": peak / plan_peak if plan_peak else None,
        "predicted_step_s": predicted,
        "step_over_predicted": step_s / predicted if predicted else None,
        "predicted_parts": kind_plan.step_parts if kind_plan else None,
        "plan_step_lower_bound_s": kind_plan.step_lower_bound_s if kind_plan else None,
        "step_over_lower_bound": step_s / kind_plan.step_lower_bound_s if kind_plan else None,
    }


def plan_for(cfg):
    """(plan for this GPU's kind at world size 1, error): a failing plan is recorded, never fatal."""
    import torch

    from trainer.plan.estimate import make_plan
    from trainer.plan.gpus import match_device_name

    kind = match_device_name(torch.cuda.get_device_name(0))
    try:
        return make_plan(copy.deepcopy(cfg), 1, 1, [kind] if kind else [], target="cuda"), None
    except Exception as exc:  # noqa: BLE001 - recorded in the result with its type
        print(
            f"gpu_check: the plan failed ({type(exc).__name__}: {exc}); measuring without it", file=sys.stderr
        )
        return None, f"{type(exc).__name__}: {exc}"


def init_one_gpu():
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    return device
