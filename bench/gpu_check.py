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
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_measure import check_config, init_one_gpu, measure, plan_for  # noqa: E402

EXIT_NO_GPU = 3
EXIT_NO_PLAN = 4  # measured, but the plan it is checked against failed: no verdict on the prediction


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
