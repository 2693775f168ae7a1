"""The plan as text (bin/train --plan, the preflight) and the preflight's fit decision.

print(format_plan(plan))
notes = preflight_plan(cfg, world_size, nnodes, device_name)   # PreflightError: predicted not to fit
"""

from __future__ import annotations

from trainer.plan.estimate import Plan, fitting_changes, largest_categories, make_plan
from trainer.plan.gpus import GPU_KINDS, GpuKind, gpu_kind, grace, match_device_name


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.2f} s"
    hours, rest = divmod(seconds, 3600)
    return f"{int(hours)} h {rest / 60:.0f} min" if hours else f"{seconds / 60:.1f} min"


def format_plan(plan: Plan) -> str:
    lines = [
        f"plan of {plan.config} on {plan.world_size} rank(s) ({plan.nnodes} node(s)), target {plan.target}: "
        f"{plan.parameters:,} parameters ({plan.trained_parameters:,} trained), {plan.mixed_precision}, "
        f"activation checkpointing {plan.activation_checkpointing}"
        + (
            " (the peak below is full's; each kind's choice at the end)"
            if plan.activation_checkpointing == "auto"
            else ""
        ),
        f"  micro-batch {plan.batch_size} x {plan.tokens_per_micro_batch:,} tokens, grad_accum "
        f"{plan.grad_accum}, {plan.steps} steps; attention {plan.attention}",
        f"  peak memory per rank {gib(plan.memory['total'])} ({plan.memory_method}; traced in "
        f"{plan.trace_seconds:.0f} s):",
    ]
    for name, value in sorted(plan.memory.items(), key=lambda kv: -kv[1]):
        if name != "total" and value > 0:
            lines.append(f"    {name:<24} {gib(value):>10}")
    lines += [
        f"  model FLOPs per step per rank {plan.model_flops_per_step / 1e15:.3f} PFLOP "
        f"({plan.flops_per_token / 1e9:.1f} GFLOP/token; executed with recompute "
        f"{plan.executed_flops_per_step / 1e15:.3f} PFLOP)",
        f"  per step per rank: all-gathered {gib(plan.all_gather_bytes)}, reduce-scattered "
        f"{gib(plan.reduce_scatter_bytes)}, on the wire {gib(plan.wire_bytes_per_rank)}",
        f"  checkpoint size {gib(plan.checkpoint_bytes)}",
    ]
    if plan.kinds:
        lines.append(
            f"  {'GPU':<10} {'memory':>10} {'fits (margin ' + format(plan.margin, '.0%') + ')':>18} "
            f"{'compute':>9} {'comm':>9} {'step >=':>9} {'ETA >=':>12}"
        )
    for k in plan.kinds:
        fits = "yes" if k.fits else "NO"
        lines.append(
            f"  {k.name:<10} {gib(k.memory_bytes):>10} {fits:>18} {k.compute_s:>8.2f}s {k.comm_s:>8.2f}s "
            f"{k.step_lower_bound_s:>8.2f}s {duration(k.eta_lower_bound_s):>12}"
        )
    if plan.kinds:
        lines.append("  (step >= : compute at the bf16 dense peak, communication overlapped; docs/plan.md)")
        lines += predicted_lines(plan)
    platforms = sorted({gpu_kind(k.name).platform for k in plan.kinds if _known(k.name)})
    if platforms:
        lines.append(f"  env platform: {', '.join(platforms)}")
    lines += [f"  {line}" for k in plan.kinds if _known(k.name) and (line := grace(gpu_kind(k.name)))]
    return "\n".join(lines)


def _known(name: str) -> bool:
    return any(k.name == name for k in GPU_KINDS)


def predicted_lines(plan: Plan) -> list[str]:
    """The predicted step (trainer/plan/steptime.py) per kind, and auto's activation-checkpointing rows."""
    lines = [
        f"  {'GPU':<10} {'AC':>8} {'peak':>10} {'step (predicted)':>17} {'MFU':>6} {'ETA':>12}  where it goes"
    ]
    for k in plan.kinds:
        if not k.step_s:
            continue
        top = sorted(k.step_parts.items(), key=lambda kv: -kv[1])[:3]
        where = ", ".join(f"{name} {v / k.step_s:.0%}" for name, v in top)
        lines.append(
            f"  {k.name:<10} {k.activation_checkpointing:>8} {gib(k.peak_bytes or plan.memory['total']):>10} "
            f"{k.step_s:>16.2f}s {k.mfu:>6.1%} {duration(k.eta_s):>12}  {where}"
        )
        for choice, peak, step, fits in k.ac_rows:
            lines.append(
                f"    auto: {choice:<8} peak {gib(peak)}, {step:.2f} s/step, "
                + ("fits" if fits else "does not fit")
            )
    lines.append(
        "  (predicted: calibrated on one H200 run, each constant and its source in trainer/plan/steptime.py)"
    )
    return lines


def preflight_plan(cfg, world_size: int, nnodes: int, device_name: str) -> tuple[list[str], str | None]:
    """The plan for the GPU found: (notes to print, refusal message or None). Unknown GPUs: a note only."""
    kind = match_device_name(device_name)
    if kind is None:
        return [f"plan: GPU {device_name!r} is not in trainer/plan/gpus.py; memory check skipped"], None
    plan = make_plan(cfg, world_size, nnodes, [kind])
    notes = [format_plan(plan)]
    if cfg.model.activation_checkpointing == "auto":  # the ranks run the plan's choice (config.json)
        cfg.model.activation_checkpointing = plan.kinds[0].activation_checkpointing
        notes.append(f"plan: model.activation_checkpointing=auto -> {cfg.model.activation_checkpointing}")
    refusal = refusal_message(cfg, plan, kind, world_size)
    if refusal and cfg.plan.allow_overfit:
        notes.append(f"WARNING: {refusal} -- plan.allow_overfit=true: running anyway")
        refusal = None
    return notes, refusal


def refusal_message(cfg, plan: Plan, kind: GpuKind, world_size: int) -> str | None:
    verdict = plan.kinds[0]
    if verdict.fits:
        return None
    plan.memory["total"] = int(verdict.peak_bytes or plan.memory["total"])
    largest = ", ".join(f"{name} {gib(value)}" for name, value in largest_categories(plan))
    changes = fitting_changes(cfg, world_size, kind)
    fit = [f"{what} (predicted {gib(peak)})" for what, peak, ok in changes if ok]
    advice = "; ".join(fit) if fit else "none of " + ", ".join(w for w, _, _ in changes) + " is enough alone"
    return (
        f"predicted peak {gib(plan.memory['total'])} per GPU does not fit a {kind.name} "
        f"({gib(kind.memory_bytes)}, {gib(verdict.usable_bytes)} usable with plan.margin={plan.margin:g}); "
        f"largest: {largest}; would fit: {advice}; or --set plan.allow_overfit=true to run anyway"
    )
