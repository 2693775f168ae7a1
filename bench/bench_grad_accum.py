"""Gradient accumulation under FSDP2: reduce-scatter every micro-step vs only on the last.

2 ranks, the furniture_train config's grad_accum (10), the project's WorldModel + shard_model. The two
variants alternate step by step in ONE run (ABBA order) so a drift in the host's speed hits both; the
table reports medians over those interleaved steps, the per-pair ratio, the peak memory of each
variant and its StepBreakdown. A last table times each FSDP collective alone (after a barrier) to split
communication into transfer and waiting for the other rank.

    .venv/bin/python bench/bench_grad_accum.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import PeakMemory, Table, TrainingRig, bench_config, init_distributed, median, torchrun  # noqa: E402

VARIANTS = ("every", "last")


def _worker(out_dir: Path, pairs: int) -> None:
    import torch
    import torch.distributed as dist

    rank, world, device = init_distributed()
    cfg = bench_config()
    rig = TrainingRig(cfg, rank, world, device)
    model, stream, breakdown, optimizer_step = rig.model, rig.stream, rig.breakdown, rig.step
    cuda, accum, model_name = device.type == "cuda", cfg.train.grad_accum, rig.model_name

    records = []
    for pair in range(pairs + 1):  # pair 0 warms up (allocator, first-call overheads) and is dropped
        order = VARIANTS if pair % 2 == 0 else VARIANTS[::-1]  # ABBA: linear drift cancels
        for sync in order:
            dist.barrier()
            with PeakMemory(device) as mem:
                record = optimizer_step(pair, sync)
            if pair > 0:
                records.append({"pair": pair, "sync": sync, "peak_bytes": mem.peak, "calls": breakdown.comm_calls, **record})

    # Each collective alone, after a barrier: the transfer cost, without waiting for a slower peer.
    isolated = {}
    for kind in ("grad_comm", "param_comm"):
        numel = sum(p.to_local().numel() for p in model.parameters()) * world
        buf_in = torch.zeros(numel if kind == "grad_comm" else numel // world, device=device)
        buf_out = torch.zeros(numel // world if kind == "grad_comm" else numel, device=device)
        times = []
        for _ in range(10):
            dist.barrier()
            t0 = time.perf_counter()
            if kind == "grad_comm":
                dist.reduce_scatter_tensor(buf_out, buf_in)
            else:
                dist.all_gather_into_tensor(buf_out, buf_in)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        isolated[kind] = {"numel": numel, "seconds": median(times)}

    info = {"tokens_per_micro_batch": stream.tokens_per_micro_batch, "grad_accum": accum, "world": world,
            "params": sum(p.numel() for p in model.parameters()), "device": str(device), "model": model_name}  # fmt: skip
    (out_dir / f"rank{rank}.json").write_text(json.dumps({"records": records, "isolated": isolated, "info": info}))
    dist.barrier()


PHASE_COLUMNS = ("data", "h2d", "forward", "backward", "grad_comm", "param_comm", "optimizer", "idle")


def run(quick: bool = False) -> list[Table]:
    pairs = 3 if quick else 8
    with tempfile.TemporaryDirectory(prefix="bench_grad_accum_") as tmp:
        ranks = torchrun(Path(__file__), 2, ["--pairs", str(pairs)], Path(tmp), timeout=900)
    info = ranks[0]["info"]
    by_variant = {v: [r for rank in ranks for r in rank["records"] if r["sync"] == v] for v in VARIANTS}

    def step_time(variant, pair):
        # A step ends when its slowest rank ends; ranks differ only by waiting, so take the max.
        return max(r["step_s"] for rank in ranks for r in rank["records"] if r["sync"] == variant and r["pair"] == pair)

    pair_ids = sorted({r["pair"] for r in ranks[0]["records"]})
    step = {v: [step_time(v, p) for p in pair_ids] for v in VARIANTS}
    rows = []
    for v in VARIANTS:
        recs = by_variant[v]
        peak = max(r["peak_bytes"] for r in recs) / 2**20
        grad_calls = median(r["calls"]["grad_comm"] for r in recs)
        rows.append(
            [f"sync-{v}", median(step[v]), min(step[v]), max(step[v]), median(r["compute_share"] for r in recs)]
            + [median(r[f"{p}_share"] for r in recs) for p in PHASE_COLUMNS]
            + [int(grad_calls), round(peak, 1)]
        )
    ratios = [last / every for last, every in zip(step["last"], step["every"], strict=True)]
    ratio_of_medians = median(step["last"]) / median(step["every"])
    winner = "sync-last" if ratio_of_medians < 1 else "sync-every"
    table = Table(
        title=f"Gradient accumulation: 2 ranks ({info['device']}), grad_accum {info['grad_accum']}, "
        f"{info['params'] / 1e6:.2f} M params, {info['tokens_per_micro_batch']} tokens/micro-batch",
        columns=["variant", "median step s", "min s", "max s", "compute share"]
        + [f"{p} share" for p in PHASE_COLUMNS]
        + ["reduce-scatters/step", "peak MiB/rank"],
        rows=rows,
        ratio=f"sync-last / sync-every step time = {ratio_of_medians:.3f} (ratio of medians; median per-pair "
        f"ratio {median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)} interleaved pairs): "
        f"{winner} wins",
        notes=[
            f"model: {info['model']}; config furniture_train ({'cluster' if 'cuda' in info['device'] else 'cpu_scale'}).",
            "Shares are medians over both ranks and all interleaved steps; step time per pair is the slower rank's.",
            "peak MiB: " + ("torch.cuda.max_memory_allocated" if "cuda" in info["device"] else "process RSS sampled every 2 ms (includes the Python/torch baseline)"),
        ],
    )
    iso = ranks[0]["isolated"]
    rec_last = by_variant["last"]
    comm_rows = []
    for kind, name in (("grad_comm", "reduce-scatter (grads)"), ("param_comm", "all-gather (params)")):
        calls = median(r["calls"][kind] for r in rec_last)
        measured = median(r[f"{kind}_s"] for r in rec_last)
        # Isolated: one collective over all parameters; FSDP issues one per group, same total bytes.
        per_step_bytes_time = iso[kind]["seconds"] * (calls / max(1, median(r["calls"]["grad_comm"] for r in rec_last)))
        comm_rows.append([name, int(calls), measured, iso[kind]["seconds"], per_step_bytes_time,
                          max(0.0, measured - per_step_bytes_time)])  # fmt: skip
    comm = Table(
        title="Communication in a sync-last step: transfer vs waiting for the other rank",
        columns=["collective", "calls/step", "measured s/step", "one full-model collective alone s",
                 "transfer estimate s/step", "rest = waiting/launch s/step"],  # fmt: skip
        rows=comm_rows,
        notes=["'alone' = one collective over all parameters after a barrier (median of 10); the transfer "
               "estimate scales it by how many full-model passes the step makes (all-gathers: forward + "
               "backward per micro-step; reduce-scatters: once per step with sync-last)."],  # fmt: skip
    )
    return [table, comm]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", help=argparse.SUPPRESS)  # set when torchrun runs a rank
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.out_dir:
        _worker(Path(args.out_dir), args.pairs)
        return
    for table in run(args.quick):
        print(table.markdown())


if __name__ == "__main__":
    main()
