"""The plan's check against reality: the peak memory of a real step, per category, on real ranks.

    python -m torch.distributed.run --nproc-per-node 2 -m trainer.plan.measure \\
        --config furniture_train --cpu-scale --out measured.json [--set key=value ...]

Each rank builds the model exactly as a run does (trainer.model.parallel.build_model), AdamW as
trainer.loop.train.build makes it, and a micro-batch of the run's shapes (trainer.plan.memory's synthetic
one). One whole optimizer step runs untracked (AdamW's state now exists: the steady state), then one
whole step (every micro-step of train.grad_accum, then AdamW) runs under FSDPMemTracker in real mode.
On CUDA it also records torch.cuda.max_memory_allocated over the tracked step (the allocator's own
peak). Rank 0 writes {"world_size", "memory": {category: bytes, "total"}, "cuda_max_allocated",
"step_seconds"} to --out (atomically). tests/test_plan.py compares it with the plan's prediction.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.distributed as dist


def measure(cfg, device: torch.device) -> dict:
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from trainer.model.parallel import build_model
    from trainer.plan.memory import make_optimizer, peak_by_category, synthetic_micro_batch, tracked_step

    model = build_model(cfg, device)
    optimizer = make_optimizer(model, cfg, fused=device.type == "cuda")
    batch = {k: v.to(device) for k, v in synthetic_micro_batch(cfg).items()}
    steps = list(range(cfg.train.grad_accum))

    class _Untracked:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def reset_mod_stats(self):
            pass

    tracked_step(model, optimizer, cfg, batch, _Untracked(), steps)  # step 1: AdamW's state appears
    tracker = FSDPMemTracker(model, optimizer)
    tracker.track_inputs((batch,))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    tracked_step(model, optimizer, cfg, batch, tracker, steps)
    cuda_peak = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        cuda_peak = torch.cuda.max_memory_allocated(device)
    return {
        "world_size": dist.get_world_size(),
        "memory": peak_by_category(tracker),
        "cuda_max_allocated": cuda_peak,
        "step_seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    from provision.atomic import write_json_atomic
    from trainer.config import load_config, parse_set

    parser = argparse.ArgumentParser(description="peak memory of one real step (the plan's check)")
    parser.add_argument("--config", default="furniture_train")
    parser.add_argument("--cpu-scale", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    cfg = load_config(args.config, cpu_scale=args.cpu_scale, overrides=parse_set(args.set))
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        device = (
            torch.device("cuda", dist.get_rank() % torch.cuda.device_count()) if cuda else torch.device("cpu")
        )
        if cuda:
            torch.cuda.set_device(device)
        result = measure(cfg, device)
        if dist.get_rank() == 0:
            write_json_atomic(args.out, result)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
