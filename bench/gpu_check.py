"""The first-GPU check (run by bench/gpu_check.sh): 3 real training steps at the cluster config's block
shapes with a few layers, measured against the plan (trainer/plan/), written to one JSON file.

    python bench/gpu_check.py --out gpu_check.json [--layers 4] [--steps 3] [--dry-run]

On a GPU: the cluster config (furniture_train, no cpu_scale) with model.depth=--layers, random init,
compiled FlexAttention with the LingBot mask (forward + backward), bf16 mixed precision, FSDP2 on one GPU
(a one-rank process group), activation checkpointing; micro-batches of the run's shapes
(trainer.plan.memory.synthetic_micro_batch: the recipe's draws, so chunk and window change every
micro-batch as in training). trainer.loop.train.train_step runs each step (the loop's own step and its
StepBreakdown). Recorded: per-step seconds and breakdown, MFU of steps 2..N, graphs compiled after step 1
(recompiles), torch.cuda.max_memory_allocated over steps 2..N against the plan's predicted peak, and the
measured step time against the plan's lower bound.
Without a GPU (or with --dry-run): it builds the config and the model on the meta device (so the script
cannot rot), writes {"status": "no_gpu", ...} with no measurement, says so, and exits 3.
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
        "model.activation_checkpointing": True,
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


def run(
    cfg, steps: int, out: Path, comm_timing: bool = True
) -> int:  # long: one linear measurement script, read top to bottom
    import torch
    import torch.distributed as dist
    from torch._dynamo.utils import counters

    from provision.atomic import write_json_atomic
    from trainer.loop.rig import Rig
    from trainer.loop.timing import StepBreakdown, install_comm_timing
    from trainer.loop.train import train_step, warmup_schedule
    from trainer.model.parallel import build_model
    from trainer.plan.estimate import make_plan, mfu_at
    from trainer.plan.gpus import match_device_name
    from trainer.plan.memory import make_optimizer

    name = torch.cuda.get_device_name(0)
    kind = match_device_name(name)
    started = time.perf_counter()
    try:  # the measurement must not depend on the prediction: a plan that fails is recorded, not fatal
        plan, plan_error = make_plan(copy.deepcopy(cfg), 1, 1, [kind] if kind else [], target="cuda"), None
    except Exception as exc:  # noqa: BLE001 - recorded in the result with its type
        plan, plan_error = None, f"{type(exc).__name__}: {exc}"
        print(f"gpu_check: the plan failed ({plan_error}); measuring without it", file=sys.stderr)
    plan_s = time.perf_counter() - started
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    model = build_model(cfg, device)
    optimizer = make_optimizer(model, cfg, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_schedule(cfg.train.warmup_steps))
    breakdown = StepBreakdown(device)
    if comm_timing:
        install_comm_timing(model, breakdown)
    stream = SyntheticStream(cfg)
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
        print(f"gpu_check: step {step}/{steps} {record['wall_s']:.3f} s", flush=True)
        write_json_atomic(
            out, {"status": "partial", "device": name, "steps": records, "plan_error": plan_error}
        )
    peak = torch.cuda.max_memory_allocated(device)
    recompiles = counters["stats"]["unique_graphs"] - graphs_after_first
    steady = [r["wall_s"] for r in records[1:]] or [records[0]["wall_s"]]
    step_s = sum(steady) / len(steady)
    kind_plan = plan.kinds[0] if plan and plan.kinds else None
    result = {
        "status": "measured" if plan else "measured_without_plan",
        "device": name,
        "gpu_kind": kind.name if kind else None,
        "config": {
            "depth": cfg.model.depth,
            "grad_accum": cfg.train.grad_accum,
            "tokens": stream.tokens_per_micro_batch,
        },
        "steps": records,
        "step_s_steady": step_s,
        "mfu": mfu_at(plan, kind, step_s) if kind and plan else None,
        "graphs_compiled_after_step1": recompiles,
        "dynamo_stats": dict(counters["stats"]),
        "peak_allocated_bytes": peak,
        "plan_peak_bytes": plan.memory["total"] if plan else None,
        "peak_over_plan": peak / plan.memory["total"] if plan else None,
        "plan_step_lower_bound_s": kind_plan.step_lower_bound_s if kind_plan else None,
        "step_over_lower_bound": step_s / kind_plan.step_lower_bound_s if kind_plan else None,
        "plan": plan.to_json() if plan else None,
        "plan_error": plan_error,
        "plan_seconds": plan_s,
    }
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
    args = parser.parse_args(argv)
    cfg = check_config(args.layers, args.grad_accum, args.set)
    import torch

    if args.dry_run:
        return dry_run(cfg, args.out, "--dry-run")
    if not torch.cuda.is_available():
        return dry_run(
            cfg, args.out, f"no GPU (torch {torch.__version__}: torch.cuda.is_available() is False)"
        )
    return run(cfg, args.steps, args.out, comm_timing=not args.no_comm_timing)


if __name__ == "__main__":
    raise SystemExit(main())
