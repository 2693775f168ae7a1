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

# name: (grad sync, keep params unsharded across micro-steps)
VARIANTS = {
    "sync-every": ("every", False),
    "sync-last": ("last", False),
    "sync-last + keep-unsharded": ("last", True),
}


def _worker(out_dir: Path, pairs: int) -> None:
    import torch
    import torch.distributed as dist

    rank, world, device = init_distributed()
    cfg = bench_config()
    rigs = {
        name: TrainingRig(
            cfg, rank, world, device, out_dir / f"run-{i}", grad_sync=sync, keep_params_gathered=keep
        )
        for i, (name, (sync, keep)) in enumerate(VARIANTS.items())
    }
    first = next(iter(rigs.values()))
    model, stream = first.model, first.stream
    cuda, accum, model_name = device.type == "cuda", cfg.train.grad_accum, first.model_name

    records = []
    for pair in range(pairs + 1):  # pair 0 warms up (allocator, first-call overheads) and is dropped
        names = list(VARIANTS)
        order = names if pair % 2 == 0 else names[::-1]  # ABC CBA: a linear drift hits all alike
        for sync in order:
            dist.barrier()
            with PeakMemory(device) as mem:
                record = rigs[sync].step(pair)
            if pair > 0:
                records.append(
                    {
                        "pair": pair,
                        "sync": sync,
                        "peak_bytes": mem.peak,
                        "calls": rigs[sync].breakdown.comm_calls,
                        **record,
                    }
                )

    # Each collective alone, after a barrier: the transfer cost, without waiting for a slower peer.
    isolated = {}
    for kind in ("grad_comm", "param_comm"):
        numel = -(-sum(p.numel() for p in model.parameters()) // world) * world  # padded like FSDP's
        buf_in = torch.zeros(numel if kind == "grad_comm" else numel // world, device=device)
        buf_out = torch.zeros(numel // world if kind == "grad_comm" else numel, device=device)
        times = []
        for _ in range(10):
            dist.barrier()
            t0 = time.perf_counter()
            if kind == "grad_comm":
                dist.reduce_scatter_single(buf_out, buf_in)
            else:
                dist.all_gather_single(buf_out, buf_in)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        isolated[kind] = {"numel": numel, "seconds": median(times)}

    info = {
        "tokens_per_micro_batch": stream.tokens_per_micro_batch,
        "grad_accum": accum,
        "world": world,
        "params": sum(p.numel() for p in model.parameters()),
        "device": str(device),
        "model": model_name,
    }
    (out_dir / f"rank{rank}.json").write_text(
        json.dumps({"records": records, "isolated": isolated, "info": info})
    )
    dist.barrier()


PHASE_COLUMNS = ("data", "h2d", "forward", "backward", "grad_comm", "param_comm", "optimizer", "idle")


def run(quick: bool = False, pairs: int | None = None) -> list[Table]:
    rounds = pairs or (2 if quick else 6)
    with tempfile.TemporaryDirectory(prefix="bench_grad_accum_") as tmp:
        ranks = torchrun(Path(__file__), 2, ["--pairs", str(rounds)], Path(tmp), timeout=1200)
    info = ranks[0]["info"]
    cpu = "cuda" not in info["device"]
    by_variant = {v: [r for rank in ranks for r in rank["records"] if r["sync"] == v] for v in VARIANTS}
    round_ids = sorted({r["pair"] for r in ranks[0]["records"]})

    def step_time(variant, round_id):
        # A step ends when its slowest rank ends (the faster one waits for it inside a collective).
        return max(
            r["step_s"]
            for rank in ranks
            for r in rank["records"]
            if r["sync"] == variant and r["pair"] == round_id
        )

    step = {v: [step_time(v, i) for i in round_ids] for v in VARIANTS}
    rows = []
    for v in VARIANTS:
        recs = by_variant[v]
        rows.append(
            [v, median(step[v]), min(step[v]), max(step[v]), median(r["compute_share"] for r in recs)]
            + [median(r[f"{p}_share"] for r in recs) for p in PHASE_COLUMNS]
            + [
                int(median(r["calls"]["grad_comm"] for r in recs)),
                int(median(r["calls"]["param_comm"] for r in recs)),
                round(max(r["peak_bytes"] for r in recs) / 2**20, 1),
            ]  # fmt: skip
        )

    def compare(a: str, b: str) -> str:
        # Each round runs every variant back to back (ABC CBA), so a round's ratio is paired under the
        # same host load; its median is the headline (a ratio of medians mixes rounds of different load).
        per_round = [x / y for x, y in zip(step[a], step[b], strict=True)]
        r = median(step[a]) / median(step[b])
        return (
            f"{a} / {b} step time = {median(per_round):.3f} (median of {len(per_round)} paired rounds, "
            f"range {min(per_round):.3f}-{max(per_round):.3f}; ratio of medians {r:.3f})"
        )

    def paired(a: str, b: str) -> float:
        return median([x / y for x, y in zip(step[a], step[b], strict=True)])

    winner = "sync-last" if paired("sync-last", "sync-every") < 1 else "sync-every"
    table = Table(
        title=f"Gradient accumulation: 2 ranks ({info['device']}), grad_accum {info['grad_accum']}, "
        f"{info['params'] / 1e6:.2f} M params, {info['tokens_per_micro_batch']} tokens/micro-batch",
        columns=["variant", "median step s", "min s", "max s", "compute share"]
        + [f"{p} share" for p in PHASE_COLUMNS]
        + ["reduce-scatters/step", "all-gathers/step", "peak MiB/rank"],
        rows=rows,
        ratio=compare("sync-last", "sync-every") + f": {winner} wins",
        notes=[
            compare("sync-last + keep-unsharded", "sync-last") + ".",
            f"model: {info['model']}; config furniture_train ({'cpu_scale' if cpu else 'cluster'}); "
            "variants alternate step by step (ABC CBA ...) in one run; a warm-up round is dropped.",
            "keep-unsharded: train.keep_params_gathered=true as the trainer builds it (reshard_after_forward "
            "False, reshard after backward on the last micro-step only); each variant is its own rig built "
            "by trainer.loop.train.build and stepped by trainer.loop.train.train_step.",
            "Shares are medians over both ranks and all rounds; a round's step time is the slower rank's.",
            "peak MiB: "
            + (
                "process RSS sampled every 2 ms (includes the ~0.6 GiB Python/torch baseline)"
                if cpu
                else "torch.cuda.max_memory_allocated"
            ),  # fmt: skip
        ],
    )
    iso = ranks[0]["isolated"]
    rec_last = by_variant["sync-last"]
    groups = median(r["calls"]["grad_comm"] for r in rec_last)  # one reduce-scatter per FSDP group per sync
    comm_rows = []
    for kind, name in (("grad_comm", "reduce-scatter (grads)"), ("param_comm", "all-gather (params)")):
        calls = median(r["calls"][kind] for r in rec_last)
        measured = median(r[f"{kind}_s"] for r in rec_last)
        transfer = iso[kind]["seconds"] * calls / groups  # full-model passes this step makes
        comm_rows.append(
            [name, int(calls), measured, iso[kind]["seconds"], transfer, max(0.0, measured - transfer)]
        )
    comm = Table(
        title="Communication in a sync-last step: transfer vs waiting for the other rank",
        columns=[
            "collective",
            "calls/step",
            "measured s/step",
            "one full-model collective alone s",
            "transfer estimate s/step",
            "rest = waiting + per-call overhead s/step",
        ],  # fmt: skip
        rows=comm_rows,
        notes=[
            "'alone' = one collective over all parameters after a barrier (median of 10); the transfer "
            "estimate multiplies it by the full-model passes of the step (calls / FSDP groups). What is "
            "left is time a rank sat in the collective waiting for the other rank to arrive."
        ],  # fmt: skip
    )
    return [table, comm]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", help=argparse.SUPPRESS)  # set when torchrun runs a rank
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.out_dir:
        _worker(Path(args.out_dir), args.pairs)
        return
    for table in run(args.quick, args.pairs if args.pairs != 6 else None):
        print(table.markdown())


if __name__ == "__main__":
    main()
