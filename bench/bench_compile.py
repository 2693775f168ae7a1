"""The CPU defaults of the speed options, measured: compiled blocks, AdamW implementation, data path.

2 ranks (gloo), the cpu_scale furniture_train config (the main job on this machine), each variant its own
rig built by trainer.loop.train.build and stepped by trainer.loop.train.train_step, all in ONE run; variants
alternate step by step (ABCD DCBA ...) so a drift in the host's load hits all alike; the first round
(compiles, allocator warm-up) is dropped. Ratios are medians of per-round ratios against the CPU
defaults (train.compile auto = false, train.optimizer auto = for_loop, train.data_path auto = inline).

    .venv/bin/python bench/bench_compile.py [--pairs 4]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Table, TrainingRig, bench_config, init_distributed, median, torchrun  # noqa: E402

BASE = "CPU defaults (eager blocks, for-loop AdamW, inline data)"
VARIANTS = {  # name: config overrides against the CPU defaults
    BASE: {},
    "compiled blocks (train.compile=true)": {"train.compile": "true"},
    "foreach AdamW (train.optimizer=foreach)": {"train.optimizer": "foreach"},
    "prefetched data (train.data_path=prefetch)": {"train.data_path": "prefetch"},
}


def _worker(out_dir: Path, pairs: int) -> None:
    import torch.distributed as dist

    from trainer.config import apply_overrides

    rank, world, device = init_distributed()
    cfg = bench_config({"train.compile": "false", "train.optimizer": "for_loop", "train.data_path": "inline"})
    rigs = {}
    for i, (name, overrides) in enumerate(VARIANTS.items()):
        variant = copy.deepcopy(cfg)
        apply_overrides(variant, overrides, "bench")
        rigs[name] = TrainingRig(variant, rank, world, device, out_dir / f"run-{i}")
    records = []
    for pair in range(pairs + 1):
        order = list(VARIANTS) if pair % 2 == 0 else list(VARIANTS)[::-1]
        for name in order:
            dist.barrier()
            record = rigs[name].step(pair + 1)
            records.append({"pair": pair, "variant": name, **record})  # pair 0: the first step (compiles)
    info = {"device": str(device), "world": world, "grad_accum": cfg.train.grad_accum,
            "tokens": rigs[BASE].stream.tokens_per_micro_batch}  # fmt: skip
    (out_dir / f"rank{rank}.json").write_text(json.dumps({"records": records, "info": info}))
    dist.barrier()


def run(quick: bool = False, pairs: int | None = None) -> list[Table]:
    rounds = pairs or (2 if quick else 4)
    with tempfile.TemporaryDirectory(prefix="bench_compile_") as tmp:
        ranks = torchrun(Path(__file__), 2, ["--pairs", str(rounds)], Path(tmp), timeout=3000)
    info = ranks[0]["info"]
    rounds_seen = sorted({r["pair"] for r in ranks[0]["records"]} - {0})
    steps = 40  # the CPU-scale main job (furniture_train cpu_scale: train.steps)

    def step(variant: str, pair: int) -> float:  # a step ends when its slower rank ends
        return max(r["step_s"] for rank in ranks for r in rank["records"] if r["variant"] == variant
                   and r["pair"] == pair)  # fmt: skip

    rows = []
    for name in VARIANTS:
        times = [step(name, p) for p in rounds_seen]
        ratios = [step(name, p) / step(BASE, p) for p in rounds_seen]
        recs = [r for r in ranks[0]["records"] if r["variant"] == name and r["pair"] > 0]
        job = step(name, 0) + (steps - 1) * median(times)  # the first step compiles, then steady steps
        job_base = step(BASE, 0) + (steps - 1) * median(step(BASE, p) for p in rounds_seen)
        shares = [median(r[f"{p}_share"] for r in recs) for p in ("data", "optimizer")]
        rows.append([name, median(times), min(times), max(times), median(ratios), min(ratios), max(ratios),
                     step(name, 0), job / job_base, *shares])  # fmt: skip
    faster = [f"{r[0]} (steady {r[4]:.3f}x, {steps}-step job {r[8]:.3f}x)" for r in rows[1:] if r[4] < 1]
    return [
        Table(
            title=f"CPU speed options: 2 ranks ({info['device']}), cpu_scale furniture_train, grad_accum "
            f"{info['grad_accum']}, {info['tokens']} tokens/micro-batch, {len(rounds_seen)} paired rounds",
            columns=[
                "variant",
                "median step s",
                "min s",
                "max s",
                "step / defaults (median of rounds)",
                "ratio min",
                "ratio max",
                "first step s (compiles)",
                f"{steps}-step job / defaults' (first + {steps - 1} x median)",
                "data share",
                "optimizer share",
            ],  # fmt: skip
            rows=rows,
            ratio="faster than the CPU defaults: " + (", ".join(faster) if faster else "none"),
            notes=[
                "one run, variants interleaved (ABCD DCBA ...), the compiling warm-up round dropped; each "
                "variant is a rig from trainer.loop.train.build stepped by trainer.loop.train.train_step"
            ],  # fmt: skip
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", help=argparse.SUPPRESS)  # set when torchrun runs a rank
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.out_dir:
        _worker(Path(args.out_dir), args.pairs)
        return
    for table in run(args.quick, args.pairs):
        print(table.markdown())


if __name__ == "__main__":
    main()
