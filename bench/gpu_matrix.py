"""bench/gpu_check.py's matrix: every speed option against the one it replaced, and the full-depth model,
in one process on one GPU, within a time budget; one JSON file and one markdown table.

    run_matrix(args, out)          # on a GPU: the rows below, in this order, until --budget-s is spent
    dry_matrix(layers, accum, extra, md)   # anywhere: every row's config built and predicted, nothing run

Rows (the cluster config's shapes: 4,224 tokens per micro-batch, --layers blocks, --grad-accum):
the candidates; the 2026-12-04 configuration, still the defaults (blocks eager, full AC, inline data); the
full 30-layer model (or the deepest the plan says fits one GPU, said in the row) with the plan's
activation-checkpointing choice; then one option changed at a time from the candidates (compile off,
AC full / op / block:2, inline data, foreach AdamW, explicit FSDP2 prefetch). Plans are traced first,
before any real step (the FakeTensor fix of 2026-12-04 is exercised by that order), once per
activation-checkpointing choice. Each row records step time and breakdown, MFU, peak memory against the
plan and step time against the prediction (trainer/plan/steptime.py).
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

NEW = {"train.compile": "true", "model.activation_checkpointing": "none", "train.data_path": "prefetch"}
ROWS: list[tuple[str, dict]] = [
    ("candidate defaults (compile, AC none, prefetch, fused AdamW)", NEW),
    (
        "2026-12-04 config (eager blocks, AC full, inline data)",
        {"train.compile": "false", "model.activation_checkpointing": "full", "train.data_path": "inline"},
    ),
    ("FULL DEPTH", {}),  # placeholder: replaced by the full-depth row
    ("compile off", {**NEW, "train.compile": "false"}),
    ("AC full", {**NEW, "model.activation_checkpointing": "full"}),
    ("AC op (selective)", {**NEW, "model.activation_checkpointing": "op"}),
    ("AC block:2", {**NEW, "model.activation_checkpointing": "block:2"}),
    ("inline data", {**NEW, "train.data_path": "inline"}),
    ("foreach AdamW", {**NEW, "train.optimizer": "foreach"}),
    ("FSDP2 explicit prefetch 1", {**NEW, "train.fsdp_prefetch": 1}),
]
FULL_DEPTH = 30


def _configs(layers: int, grad_accum: int, extra: list[str], deepest: int) -> list[tuple[str, object]]:
    from bench.gpu_measure import check_config

    out = []
    for name, overrides in ROWS:
        sets = [f"{k}={v}" for k, v in overrides.items()] + list(extra)
        if name == "FULL DEPTH":
            said = "" if deepest == FULL_DEPTH else f" (deepest that fits: {deepest} of {FULL_DEPTH})"
            cfg = check_config(deepest, grad_accum, [f"{k}={v}" for k, v in NEW.items()] + list(extra))
            cfg.model.activation_checkpointing = "auto"  # the plan's choice for this GPU
            out.append((f"full depth{said}, plan's AC, compile, prefetch", cfg))
        else:
            out.append((name, check_config(layers, grad_accum, sets)))
    return out


def deepest_fitting(cfg, kind) -> int:
    """The deepest model (<= 30 blocks) whose traced peak with full AC fits `kind` on one GPU (the
    trace is affine in depth: trainer/plan/memory.py traces depths 2 and 3)."""
    from trainer.plan.memory import TRACE_DEPTHS, traced_peak

    shallow = copy.deepcopy(cfg)
    shallow.model.activation_checkpointing = "full"
    peaks = []
    for d in TRACE_DEPTHS:
        shallow.model.depth = d
        peaks.append(traced_peak(shallow, 1, "cuda")["total"])
    per_block = peaks[1] - peaks[0]
    usable = kind.memory_bytes * (1 - cfg.plan.margin)
    fits = TRACE_DEPTHS[0] + int((usable - peaks[0]) // per_block) if per_block > 0 else FULL_DEPTH
    return max(1, min(FULL_DEPTH, fits))


def markdown(rows: list[dict], device: str) -> str:
    def f(v, fmt):
        return format(v, fmt) if isinstance(v, int | float) else "-"

    lines = [
        f"### bench/gpu_check.sh matrix on {device}",
        "",
        "| row | depth | AC | step s | predicted s | measured / predicted | MFU | peak GiB | plan GiB | "
        "peak / plan | forward s | backward s | data s | optimizer s | graphs after step 1 | status |",
        "|" + "---|" * 16,
    ]
    for r in rows:
        c, s = r.get("config", {}), (r.get("steps") or [{}])[-1]
        cells = [
            r["row"], c.get("depth", "-"), c.get("activation_checkpointing", "-"),
            f(r.get("step_s_steady"), ".3f"), f(r.get("predicted_step_s"), ".3f"),
            f(r.get("step_over_predicted"), ".2f"), f(r.get("mfu"), ".1%"),
            f(r.get("peak_allocated_bytes") and r["peak_allocated_bytes"] / 2**30, ".2f"),
            f(r.get("plan_peak_bytes") and r["plan_peak_bytes"] / 2**30, ".2f"),
            f(r.get("peak_over_plan"), ".3f"),
            *(f(s.get(f"{p}_s"), ".3f") for p in ("forward", "backward", "data", "optimizer")),
            r.get("graphs_compiled_after_step1", "-"), r["status"],
        ]  # fmt: skip
        lines.append("| " + " | ".join(str(x) for x in cells) + " |")
    return "\n".join(lines) + "\n"


def dry_matrix(layers: int, grad_accum: int, extra: list[str], md: Path) -> None:
    """Every row's config built (rules checked) and its step predicted for an H200; nothing measured."""
    from provision.atomic import write_atomic
    from trainer.plan.gpus import gpu_kind
    from trainer.plan.memory import target_config
    from trainer.plan.steptime import predict_step

    rows = []
    for name, cfg in _configs(layers, grad_accum, extra, FULL_DEPTH):
        resolved = target_config(cfg, "cuda")
        if resolved.model.activation_checkpointing == "auto":
            resolved.model.activation_checkpointing = "full"
        pred = predict_step(resolved, 1, 1, gpu_kind("H200"))
        rows.append(
            {
                "row": name,
                "status": "not run (dry run): prediction only",
                "predicted_step_s": pred.step_s,
                "config": {
                    "depth": cfg.model.depth,
                    "activation_checkpointing": resolved.model.activation_checkpointing,
                },
            }
        )
    write_atomic(md, markdown(rows, "no GPU (dry run, H200 predictions)"))


def run_matrix(args, out: Path) -> int:  # long: one linear measurement script, read top to bottom
    import gc

    import torch
    import torch.distributed as dist

    from bench.gpu_measure import init_one_gpu, measure, plan_for
    from provision.atomic import write_atomic, write_json_atomic
    from trainer.plan.gpus import match_device_name

    started = time.perf_counter()
    name = torch.cuda.get_device_name(0)
    kind = match_device_name(name)
    base = _configs(args.layers, args.grad_accum, args.set, FULL_DEPTH)[0][1]
    deepest = deepest_fitting(base, kind) if kind else FULL_DEPTH
    configs = _configs(args.layers, args.grad_accum, args.set, deepest)
    traced: dict[str, tuple] = {}
    row_plans = []
    for _, cfg in configs:  # every plan before any real step; the full-depth row runs the plan's choice
        key = json.dumps(cfg.to_dict(), sort_keys=True)  # each row's own prediction; traces are shared
        if key not in traced:
            traced[key] = plan_for(cfg)
        plan = traced[key][0]
        if cfg.model.activation_checkpointing == "auto":
            cfg.model.activation_checkpointing = (
                plan.kinds[0].activation_checkpointing if plan and plan.kinds else "full"
            )
        row_plans.append(traced[key])
    planned_s = time.perf_counter() - started
    device = init_one_gpu()
    rows: list[dict] = []
    result = {
        "status": "partial",
        "device": name,
        "gpu_kind": kind.name if kind else None,
        "rows": rows,
        "deepest_fitting": deepest,
        "plan_seconds": planned_s,
    }
    for (row, cfg), (plan, plan_error) in zip(configs, row_plans, strict=True):
        elapsed = time.perf_counter() - started
        if elapsed > args.budget_s:
            rows.append(
                {"row": row, "status": f"skipped: {elapsed:.0f} s spent of --budget-s {args.budget_s:g}"}
            )
            continue
        torch._dynamo.reset()
        try:
            got = measure(cfg, args.steps, device, plan, comm_timing=not args.no_comm_timing)
            got.update(row=row, status="measured", plan_error=plan_error)
        except Exception as exc:  # noqa: BLE001 - a row that fails (OOM, compile) is recorded, the rest run
            got = {"row": row, "status": f"failed: {type(exc).__name__}: {str(exc)[:300]}"}
        rows.append(got)
        gc.collect()
        torch.cuda.empty_cache()
        write_json_atomic(out, result)
        write_atomic(out.with_suffix(".md"), markdown(rows, name))
    result["status"] = "measured"
    result["seconds"] = time.perf_counter() - started
    write_json_atomic(out, result)
    write_atomic(out.with_suffix(".md"), markdown(rows, name))
    print(markdown(rows, name))
    print(json.dumps({"deepest_fitting": deepest, "seconds": result["seconds"]}))
    dist.destroy_process_group()
    return 0
