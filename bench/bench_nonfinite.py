"""Cost of the divergence checks (trainer/loop/divergence.py): per step and per checkpoint save.

2 ranks, the furniture_train config (cpu_scale without a GPU). Measured, interleaved with training
steps of trainer.loop.train.train_step:
  - per step: the step's agreement with the checks (each rank's non-finite slots appended to the one
    all_reduce, blame, the policy) against the agreement without them (the 4-value all_reduce the loop
    did before), each repeated `--inner` times per sample; the difference is the checks' cost;
  - per save: first_nonfinite(model, optimizer) on this rank's own shard (what Checkpointer.save runs
    before writing) against Checkpointer.save itself.

    .venv/bin/python bench/bench_nonfinite.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Table, TrainingRig, bench_config, init_distributed, median, torchrun  # noqa: E402


def _worker(out_dir: Path, repeats: int, inner: int) -> None:
    import torch
    import torch.distributed as dist

    from trainer.checkpoint.checkpointer import Checkpointer
    from trainer.checkpoint.finite import first_nonfinite
    from trainer.config import CheckpointConfig
    from trainer.loop.divergence import NonfinitePolicy, blame, local_slots

    rank, world, device = init_distributed()
    cfg = bench_config()
    rig = TrainingRig(cfg, rank, world, device, out_dir / "rig")
    latent, action = torch.tensor(1.5, device=device), torch.tensor(0.7, device=device)
    zero = torch.tensor(0.0, device=device)
    policy = NonfinitePolicy("stop", 3)

    def plain() -> None:  # the agreement before the checks: losses, stop flag, failure flag
        agreed = torch.stack([latent, action, zero, zero])
        dist.all_reduce(agreed)
        agreed[2].item(), agreed[3].item(), (agreed[:2] / 2).tolist()

    def checked() -> None:  # the same plus the slots, blame and the policy
        slots = local_slots(latent, action, rank, world)
        agreed = torch.cat([torch.stack([latent, action, zero, zero]), slots])
        dist.all_reduce(agreed)
        agreed[2].item(), agreed[3].item()
        a, b = (agreed[:2] / 2).tolist()
        policy.decide(blame(1, agreed[4:].tolist(), {"latent_loss": a, "action_loss": b}, 1.0))

    def timed(fn, n: int = 1) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dist.barrier()
        return (time.perf_counter() - t0) / n

    rig.step(0)  # warm-up; creates the optimizer state
    checkpointer = Checkpointer(
        out_dir / "run" / "checkpoints", CheckpointConfig(keep=1), last_step=0, attempt="bench", device=device
    )
    samples = []
    for i in range(repeats):
        step_s = timed(lambda i=i: rig.step(1 + i))
        samples.append(
            {
                "step": step_s,
                "plain": timed(plain, inner),
                "checked": timed(checked, inner),
                "scan": timed(lambda: first_nonfinite(rig.model, rig.optimizer)),
                "save": timed(
                    lambda i=i: checkpointer.save(
                        10 + i, rig.model, rig.optimizer, rig.scheduler, train_state={"bench": True}
                    )
                ),
            }
        )
    params = sum(p.numel() for p in rig.model.parameters())
    result = {"samples": samples, "params": params, "device": str(device), "model": rig.model_name}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()


def run(quick: bool = False) -> list[Table]:
    repeats, inner = (3, 50) if quick else (5, 200)
    with tempfile.TemporaryDirectory(prefix="bench_nonfinite_") as tmp:
        ranks = torchrun(
            Path(__file__), 2, ["--repeats", str(repeats), "--inner", str(inner)], Path(tmp), timeout=900
        )
    r0 = ranks[0]

    def stat(key: str) -> float:
        return median(max(r["samples"][i][key] for r in ranks) for i in range(repeats))

    step, plain, checked, scan, save = (stat(k) for k in ("step", "plain", "checked", "scan", "save"))
    extra = max(0.0, checked - plain)
    rows = [
        ["training step (train_step)", step, 1.0],
        ["agreement without the checks (4-value all_reduce)", plain, plain / step],
        ["agreement with the checks (+ slots, blame, policy)", checked, checked / step],
        ["the checks' cost per step (difference)", extra, extra / step],
        ["Checkpointer.save (includes the scan below)", save, save / step],
        ["first_nonfinite: this rank's params + AdamW moments", scan, scan / save],
    ]
    return [
        Table(
            title=f"Divergence checks: 2 ranks ({r0['device']}), {r0['params'] / 1e6:.2f}M params "
            f"(sharded view), training step {step:.3f} s",
            columns=["what", "seconds", "share (of the step; the scan: of the save)"],
            rows=rows,
            ratio=f"checks per step: {extra / step:.3%} of the step; the save's scan: {scan / save:.2%} of "
            "the save",
            notes=[
                f"model: {r0['model']}; medians of {repeats} samples, each the slower rank, barrier to "
                f"barrier; the agreements are averaged over {inner} calls per sample.",
                "the step's all_reduce itself existed before the checks (one per step); the checks add "
                "2 x world_size values to it and a few host-side comparisons.",
            ],
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", help=argparse.SUPPRESS)  # set when torchrun runs a rank
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--inner", type=int, default=200)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.out_dir:
        _worker(Path(args.out_dir), args.repeats, args.inner)
        return
    for table in run(quick=args.quick):
        print(table.markdown())


if __name__ == "__main__":
    main()
