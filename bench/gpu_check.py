"""The GPU check (run by bench/gpu_check.sh): training steps at the cluster config's shapes on one GPU,
measured against the plan (trainer/plan/: peak memory, predicted step time), written to one JSON file.

    python bench/gpu_check.py --out gpu_check.json [--layers 4] [--steps 3] [--budget-s 290] [--dry-run]
    python bench/gpu_check.py --out gpu_check.json --single [--layers 4] [--set KEY=VALUE ...]

Default: the matrix of bench/gpu_matrix.py (the candidates, the configuration they would replace, the full
30-layer model or the deepest that fits, one option changed at a time), plus gpu_check.md beside the
JSON. --single: the one config of --layers/--set (the 2026-12-04 check). Each config: the cluster config
(furniture_train, no cpu_scale) with model.depth=--layers, random init, compiled FlexAttention with the
LingBot mask (forward + backward), bf16 mixed precision, FSDP2 on one GPU (a one-rank process group);
micro-batches of the run's shapes (trainer.plan.memory.synthetic_micro_batch: the recipe's draws, so chunk
and window change every micro-batch as in training), through trainer.loop.train.train_step (the loop's own
step and its StepBreakdown). Recorded: per-step seconds and breakdown, MFU of steps 2..N, graphs compiled
after step 1 (recompiles) and graph breaks, torch.cuda.max_memory_allocated over steps 2..N against the
plan's predicted peak, and the measured step time against the plan's prediction and lower bound.
Without a GPU (or with --dry-run): it builds the config and the model on the meta device, and (matrix)
every row's config with its predicted step (so the script cannot rot), writes {"status": "no_gpu", ...}
with no measurement, says so, and exits 3.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EXIT_NO_GPU = 3
EXIT_NO_PLAN = 4  # measured, but the plan it is checked against failed: no verdict on the prediction


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


def dry_run(cfg, out: Path, reason: str) -> int:
    import torch

    from provision.atomic import write_json_atomic
    from trainer.model import WorldModel

    with torch.device("meta"):
        model = WorldModel(cfg)
    params = sum(p.numel() for p in model.parameters())
    write_json_atomic(
        out, {"status": "no_gpu", "reason": reason, "config": cfg.to_dict(), "parameters": params}
    )
    print(
        f"gpu_check: {reason}: nothing measured (config and meta model of {params:,} parameters built; {out})"
    )
    return EXIT_NO_GPU


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


def run(cfg, steps: int, out: Path, comm_timing: bool = True) -> int:
    """One config (--single): the plan, then the steps; one JSON file."""
    import torch
    import torch.distributed as dist

    from provision.atomic import write_json_atomic

    started = time.perf_counter()
    plan, plan_error = plan_for(cfg)
    plan_s = time.perf_counter() - started
    device = init_one_gpu()
    result = measure(cfg, steps, device, plan, comm_timing)
    result.update(
        status="measured" if plan else "measured_without_plan",
        device=torch.cuda.get_device_name(0),
        plan=plan.to_json() if plan else None,
        plan_error=plan_error,
        plan_seconds=plan_s,
    )
    write_json_atomic(out, result)
    print(
        json.dumps({k: v for k, v in result.items() if k not in ("plan", "steps", "dynamo_stats")}, indent=2)
    )
    dist.destroy_process_group()
    if plan is None:
        print(
            f"gpu_check: measured, but the plan failed ({plan_error}): nothing checked; exit {EXIT_NO_PLAN}"
        )
        return EXIT_NO_PLAN
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--grad-accum", type=int, default=2)
    parser.add_argument("--dry-run", action="store_true", help="build everything, measure nothing, exit 3")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    parser.add_argument(
        "--no-comm-timing", action="store_true", help="leave FSDP's collectives unwrapped (a diagnosis)"
    )
    parser.add_argument("--single", action="store_true", help="only the one config (--layers, --set)")
    parser.add_argument("--budget-s", type=float, default=290, help="matrix: start no row after this")
    args = parser.parse_args(argv)
    cfg = check_config(args.layers, args.grad_accum, args.set)
    import torch

    from bench.gpu_matrix import dry_matrix, run_matrix

    reason = "--dry-run" if args.dry_run else None
    if reason is None and not torch.cuda.is_available():
        reason = f"no GPU (torch {torch.__version__}: torch.cuda.is_available() is False)"
    if reason is not None:
        if not args.single:
            dry_matrix(args.layers, args.grad_accum, args.set, args.out.with_suffix(".md"))
        return dry_run(cfg, args.out, reason)
    if args.single:
        return run(cfg, args.steps, args.out, comm_timing=not args.no_comm_timing)
    return run_matrix(args, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
