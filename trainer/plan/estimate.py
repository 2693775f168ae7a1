"""The plan's numbers: traced memory, model FLOPs, bytes moved by FSDP2, lower-bound step time, ETA, fit.

    plan = make_plan(cfg, world_size, nnodes, kinds)   # kinds: GpuKind list; [] with target="cpu"
    verdict = fit_verdict(plan, kind)                  # fits?, usable bytes, margin, largest categories
    changes = fitting_changes(cfg, world_size, kind)   # the --set changes predicted to fit (re-traced)

Accounting (per rank, per optimizer step of grad_accum micro-batches):
- model FLOPs = WorldModel.flops_per_token() x real tokens per micro-batch x grad_accum (what MFU counts);
  executed FLOPs add the forward that activation checkpointing recomputes (x 4/3).
- FSDP2 (trainer/model/parallel.py): block parameters are all-gathered once per step with
  train.keep_params_gathered, else twice per micro-step (forward, and backward's recompute/gradient);
  the root's once per step (kept) or once per micro-step. Gradients are reduce-scattered once per step
  (train.grad_sync=last) or per micro-step (every), in fp32. Wire bytes of a ring collective per rank =
  (W - 1) / W x the unsharded size.
- Lower bound of the step time: max(executed FLOPs / bf16 dense peak, wire bytes / link bandwidth), i.e.
  compute at the data sheet's peak with communication perfectly overlapped. Real steps are slower; the
  MFU a measured step time corresponds to is model FLOPs / (seconds x peak).
- Fit: the traced peak must stay under (1 - plan.margin) of the GPU's memory (the margin covers what the
  trace does not see: CUDA context, NCCL buffers, allocator fragmentation).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field

from trainer.plan.accounting import _param_counts, comm_bytes
from trainer.plan.gpus import INTER_NODE_BYTES_PER_S, INTER_NODE_LINK, GpuKind

__all__ = ["KindPlan", "Plan", "_param_counts", "comm_bytes", "kind_plan", "make_plan"]


@dataclass
class KindPlan:
    name: str
    memory_bytes: float
    usable_bytes: float  # (1 - margin) x memory
    fits: bool
    compute_s: float
    comm_s: float
    step_lower_bound_s: float
    eta_lower_bound_s: float
    link: str
    source: str
    activation_checkpointing: str = ""  # the choice planned for this kind (auto: the fastest that fits)
    peak_bytes: float = 0.0  # traced peak of that choice
    step_s: float = 0.0  # predicted seconds per step (trainer/plan/steptime.py), what the ETA uses
    eta_s: float = 0.0
    mfu: float = 0.0  # predicted
    step_parts: dict[str, float] = field(default_factory=dict)
    ac_rows: list = field(default_factory=list)  # auto: (choice, peak, predicted s, fits) per candidate


@dataclass
class Plan:
    config: str
    world_size: int
    nnodes: int
    target: str  # cuda | cpu
    attention: str
    mixed_precision: str
    activation_checkpointing: str
    parameters: int
    trained_parameters: int
    tokens_per_micro_batch: int
    batch_size: int
    grad_accum: int
    steps: int
    margin: float
    memory: dict[str, int]  # peak bytes per category on one rank; "total" is the peak
    memory_method: str
    flops_per_token: float
    model_flops_per_step: float  # per rank
    executed_flops_per_step: float  # per rank, with activation-checkpointing recompute
    all_gather_bytes: int  # unsharded bytes gathered per step per rank
    reduce_scatter_bytes: int  # unsharded gradient bytes reduced per step per rank
    wire_bytes_per_rank: float
    checkpoint_bytes: int
    trace_seconds: float
    kinds: list[KindPlan] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def tokens_per_micro_batch(cfg) -> int:
    from trainer.model.masks import sequence_shape

    return sequence_shape(cfg).tokens(cfg.train.batch_size)


def kind_plan(plan: Plan, kind: GpuKind, resolved=None, counts=None, peaks=None) -> KindPlan:
    """The bound, the fit and (with the resolved config) the predicted step of `plan` on `kind`;
    peaks (model.activation_checkpointing=auto): the traced peak of each choice, to pick from."""
    link_bw, link = kind.link_bytes_per_s, kind.link
    if plan.nnodes > 1:
        link_bw, link = min(link_bw, INTER_NODE_BYTES_PER_S), f"{INTER_NODE_LINK} (between nodes)"
    compute = plan.executed_flops_per_step / kind.bf16_dense_flops
    comm = plan.wire_bytes_per_rank / link_bw
    step = max(compute, comm)
    usable = kind.memory_bytes * (1 - plan.margin)
    peak, choice, rows = plan.memory["total"], plan.activation_checkpointing, []
    if peaks is not None and resolved is not None:
        from trainer.plan.choices import ac_choices, pick, with_ac

        rows = ac_choices(resolved, plan.world_size, plan.nnodes, kind, peaks, counts)
        choice = pick(rows)
        peak, resolved = peaks[choice]["total"], with_ac(resolved, choice)
        compute *= _recompute_factor(choice) / _recompute_factor(plan.activation_checkpointing)
        step = max(compute, comm)
    out = KindPlan(
        kind.name, kind.memory_bytes, usable, peak <= usable, compute, comm, step, step * plan.steps, link,
        kind.source, choice, peak, ac_rows=rows,
    )  # fmt: skip
    if resolved is not None and plan.target == "cuda":
        from trainer.plan.steptime import predict_step

        pred = predict_step(resolved, plan.world_size, plan.nnodes, kind, counts)
        out.step_s, out.eta_s, out.mfu, out.step_parts = (
            pred.step_s,
            pred.step_s * plan.steps,
            pred.mfu,
            pred.parts,
        )
    return out


def _recompute_factor(choice: str) -> float:
    """Executed / model FLOPs of an activation-checkpointing choice (full recomputes one forward: 4/3)."""
    from trainer.config.perf import parse_ac

    ac = parse_ac(choice, "cuda")
    return 1 + (1 / 3) / ac.every if ac.mode == "full" else 1.0


def make_plan(
    cfg, world_size: int, nnodes: int = 1, kinds: list[GpuKind] | None = None, target: str = "cuda"
):
    """The plan of cfg on world_size ranks; kinds: the GPU kinds to evaluate (target cuda)."""
    from trainer.checkpoint.size import estimate_bytes, model_size
    from trainer.plan.memory import TRACE_DEPTHS, target_config, traced_peak

    resolved = target_config(cfg, target)
    started = time.perf_counter()
    peaks = None
    if resolved.model.activation_checkpointing == "auto" and target == "cuda":
        from trainer.plan.choices import ac_peaks

        peaks = ac_peaks(resolved, world_size)  # each choice traced; kind_plan picks per kind
        memory = peaks["full"]
    else:
        memory = traced_peak(cfg, world_size, target)
    traced = time.perf_counter() - started
    counts = _param_counts(resolved)
    bf16 = resolved.train.mixed_precision == "bf16"
    gathered, reduced, wire = comm_bytes(resolved, counts, world_size, 2 if bf16 else 4)
    tokens = tokens_per_micro_batch(resolved)
    model_flops = counts[4] * tokens * resolved.train.grad_accum
    ac = "full" if peaks is not None else resolved.model.activation_checkpointing
    executed = model_flops * _recompute_factor(ac)
    if target == "cuda":
        attention = "flex (compiled FlexAttention: no score matrix; traced with a stand-in of its memory)"
    else:
        attention = "sdpa (dense LingBot mask)" if resolved.model.attention != "flex" else "flex"
    depth = resolved.model.depth
    method = "FSDPMemTracker over a fake process group, FakeTensorMode, meta model; steady state"
    if depth > TRACE_DEPTHS[-1]:
        method += f"; traced at depths {TRACE_DEPTHS} and extrapolated linearly to {depth}"
    plan = Plan(
        config=cfg.name, world_size=world_size, nnodes=nnodes, target=target, attention=attention,
        mixed_precision=resolved.train.mixed_precision,
        activation_checkpointing="auto" if peaks is not None else ac, parameters=counts[0],
        trained_parameters=counts[1], tokens_per_micro_batch=tokens, batch_size=resolved.train.batch_size,
        grad_accum=resolved.train.grad_accum, steps=resolved.train.steps, margin=resolved.plan.margin,
        memory=memory, memory_method=method, flops_per_token=counts[4], model_flops_per_step=model_flops,
        executed_flops_per_step=executed, all_gather_bytes=gathered, reduce_scatter_bytes=reduced,
        wire_bytes_per_rank=wire, checkpoint_bytes=estimate_bytes(resolved, model_size(resolved), world_size),
        trace_seconds=traced,
    )  # fmt: skip
    plan.kinds = [kind_plan(plan, k, resolved, counts, peaks) for k in (kinds or [])]
    return plan


def mfu_at(plan: Plan, kind: GpuKind, seconds_per_step: float) -> float:
    """The MFU a measured step time corresponds to (model FLOPs per rank / (seconds x bf16 dense peak))."""
    return plan.model_flops_per_step / (seconds_per_step * kind.bf16_dense_flops)


def largest_categories(plan: Plan, count: int = 3) -> list[tuple[str, int]]:
    items = [(k, v) for k, v in plan.memory.items() if k != "total" and v > 0]
    return sorted(items, key=lambda kv: -kv[1])[:count]


def candidate_changes(cfg, world_size: int) -> list[tuple[str, dict, int]]:
    """(description, --set overrides, world size) of each change that lowers the per-GPU peak."""
    t, m = cfg.train, cfg.model
    sets: list[dict] = []
    if m.activation_checkpointing in ("none", "false", "op") or m.activation_checkpointing.startswith(
        "block"
    ):
        sets.append({"model.activation_checkpointing": "full"})
    if t.keep_params_gathered:
        sets.append({"train.keep_params_gathered": False})
    if t.grad_sync == "last" and t.grad_accum > 1:
        sets.append({"train.grad_sync": "every"})
    if t.batch_size > 1:
        sets.append({"train.batch_size": t.batch_size // 2, "train.grad_accum": t.grad_accum * 2})
    out = [(set_flags(s), s, world_size) for s in sets]
    out.append((f"{2 * world_size} ranks (more GPUs per node, or more nodes)", {}, 2 * world_size))
    return out


def set_flags(overrides: dict) -> str:
    return " ".join(f"--set {k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides.items())


def fitting_changes(cfg, world_size: int, kind: GpuKind) -> list[tuple[str, int, bool]]:
    """Each candidate change (and all the --set ones together), re-traced: (change, peak bytes, fits)."""
    from trainer.config import apply_overrides
    from trainer.plan.memory import traced_peak

    usable = kind.memory_bytes * (1 - cfg.plan.margin)
    candidates = candidate_changes(cfg, world_size)
    sets = [c for c in candidate_changes(cfg, world_size) if c[1]]
    if len(sets) > 1:
        merged: dict = {}
        for _, overrides, _ in sets:
            merged.update(overrides)
        candidates.append((" ".join(c[0] for c in sets), merged, world_size))
    results = []
    for description, overrides, ranks in candidates:
        changed = copy.deepcopy(cfg)
        apply_overrides(changed, overrides, "plan")
        peak = traced_peak(changed, ranks, "cuda")["total"]
        results.append((description, peak, peak <= usable))
    return results
