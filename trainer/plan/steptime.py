"""The plan's step-time prediction (not a bound): per op class, at an achievable fraction of each peak.

    pred = predict_step(cfg, world_size, nnodes, kind)   # cfg resolved for the GPU (target_config)
    pred.step_s, pred.parts                             # seconds per optimizer step; where they go

Per micro-batch on one rank, for each block: matmuls at CALIBRATION matmul_efficiency x the bf16 dense
peak; attention (FlexAttention over the LingBot mask's allowed pairs, plus the text cross-attention) at
attention_efficiency x peak, its backward 2.5x its forward (FlashAttention's split); memory-bound
elementwise work (fp32 LayerNorms, RMSNorms, RoPE, modulation, GELU, residuals) as bytes moved at
hbm_efficiency x the HBM bandwidth, eager_bytes_per_dim x dim bytes per token per block forward (counted
from TransformerBlock.forward's eager ops), x compiled_bytes_factor when train.compile fuses them,
backward 2x forward. Activation checkpointing: full recomputes the whole forward of the blocks it wraps,
op-level (model.activation_checkpointing=op) only the elementwise part. Outside the blocks (the per-micro-
batch mask, embeddings, heads, loss: eager, unaffected by block compile): nonblock_s per micro-batch,
measured, scaled by real tokens and by the HBM bandwidth. Per step: AdamW (fused) + the clip as
optimizer_bytes_per_param x trained parameters per rank at HBM speed; the data draw inline (measured
seconds per micro-batch) or hidden behind compute (train.data_path=prefetch); communication exposed:
the first all-gather and the last reduce-scatter of one block, plus whatever of the whole step's
traffic the compute cannot hide.

CALIBRATION holds every constant with its source. Two are fitted to the only GPU measurement
(bench/results/2026-12-04-gpu-check.md, one H200, 4 of 30 layers, grad_accum 2, blocks eager, full AC,
data inline): nonblock_s (forward + backward per micro-batch minus the modelled blocks) and the
optimizer's efficiency (its measured phase); the data draw is that run's measured phase. So that run is
predicted within a few percent by construction (tests/test_steptime.py holds it to 20%); every other
configuration is a prediction until bench/gpu_check.sh measures it (its matrix compares each).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Any

from trainer.plan.gpus import GpuKind

TB = 1e12
# HBM bandwidth per GPU, from the same data sheets as trainer/plan/gpus.py
HBM_BYTES_PER_S = {
    "GB200": 8.0 * TB,  # GB200 NVL72 data sheet: 576 TB/s over 72 GPUs
    "B200": 8.0 * TB,  # DGX B200 data sheet: 64 TB/s over 8 GPUs
    "GH200": 4.0 * TB,  # GH200 data sheet: 4 TB/s HBM3 (96 GB; the 144 GB HBM3e variant: 4.9 TB/s)
    "H200": 4.8 * TB,  # H200 data sheet: 4.8 TB/s
    "H100 NVL": 3.9 * TB,  # H100 data sheet (NVL): 3.9 TB/s
    "H100 PCIe": 2.0 * TB,  # H100 PCIe data sheet: 2.0 TB/s
    "H100": 3.35 * TB,  # H100 data sheet (SXM): 3.35 TB/s
    "A100": 2.039 * TB,  # A100 data sheet (80 GB SXM): 2,039 GB/s
}

# The one measured GPU run the fitted constants come from (bench/results/2026-12-04-gpu-check.md)
REFERENCE: dict[str, Any] = {
    "kind": "H200", "depth": 4, "grad_accum": 2, "tokens": 4224, "step_s": 0.2637,
    "forward_backward_s": (0.1039 + 0.1037 + 0.0886 + 0.1023) / 2,  # steps 2-3: forward + backward
    "data_s": (0.0436 + 0.0404) / 2, "optimizer_s": (0.0152 + 0.0148) / 2, "h2d_s": (0.0067 + 0.0059) / 2,
}  # fmt: skip


@dataclass(frozen=True)
class Constant:
    value: float
    source: str


CALIBRATION: dict[str, Constant] = {
    "matmul_efficiency": Constant(0.70, "assumed: bf16 cuBLAS GEMMs of 4k x 3k x 3k-14k reach ~70% of the "
                                  "dense peak on H100/H200-class GPUs; pending bench/gpu_check.sh"),
    "attention_efficiency": Constant(0.35, "assumed: FlexAttention with a block-sparse mask, ~35% of peak "
                                     "(torchtitan's FlexAttention runs: 31-32% MFU overall on H100)"),
    "hbm_efficiency": Constant(0.70, "assumed: elementwise kernels stream at ~70% of the HBM data sheet"),
    "eager_bytes_per_dim": Constant(400.0, "counted: TransformerBlock.forward's eager ops move ~400 x dim "
                                    "bytes per token (fp32 norms, (L, 6, D) fp32 modulation, RoPE, GELU)"),
    "compiled_bytes_factor": Constant(0.35, "assumed: Inductor fuses the block's elementwise chains to "
                                      "~1/3 of the eager traffic; pending bench/gpu_check.sh compile on/off"),
    "optimizer_bytes_per_param": Constant(32.0, "fused AdamW: read p, g, m, v, write p, m, v (fp32: 28 "
                                          "bytes) + the clip's read of g (4)"),
    "backward_over_forward": Constant(2.0, "2 matmuls per forward matmul; elementwise likewise"),
    "attention_backward_over_forward": Constant(2.5, "FlashAttention-2's backward/forward FLOP ratio"),
}  # fmt: skip


@dataclass
class StepPrediction:
    kind: str
    step_s: float
    parts: dict[str, float] = field(default_factory=dict)  # seconds per step by part
    model_flops: float = 0.0  # per rank per step
    mfu: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


def _c(name: str) -> float:
    return CALIBRATION[name].value


def block_costs(cfg) -> dict[str, float]:
    """Per real token, per block, forward: matmul FLOPs, attention FLOPs, eager elementwise bytes."""
    from trainer.model.masks import sequence_shape

    m, r = cfg.model, cfg.recipe
    s = sequence_shape(cfg)
    tokens = s.tokens(cfg.train.batch_size)
    text = cfg.data.text_length * cfg.train.batch_size
    d, f = m.dim, m.ffn_dim
    matmul = 2 * (6 * d * d + 2 * d * f) + 2 * 2 * d * d * text / tokens  # + cross k/v per prompt token
    chunk, window = (r.chunk_min + r.chunk_max) // 2, (r.window_min + r.window_max) // 2
    keys = _keys(s, cfg.train.batch_size, chunk, window)
    attention = 4 * d * (keys + cfg.data.text_length)
    return {
        "tokens": tokens,
        "matmul": matmul,
        "attention": attention,
        "bytes": _c("eager_bytes_per_dim") * d,
    }


@functools.cache
def _keys(shape, batch_size: int, chunk: int, window: int) -> float:
    """Mean allowed keys per query of the LingBot mask (a dense (L, L) evaluation: once per shape)."""
    from trainer.model.masks import mask_density

    return mask_density(shape, batch_size, chunk, window)


def _nonblock_s(kind: GpuKind, tokens: float) -> float:
    ref_hbm = HBM_BYTES_PER_S[REFERENCE["kind"]]
    return fitted()["nonblock_s"] * tokens / REFERENCE["tokens"] * ref_hbm / HBM_BYTES_PER_S[kind.name]


def _block_seconds(costs: dict, kind: GpuKind, compiled: bool, ac: str, every: int) -> tuple[float, float]:
    """(forward, backward incl. recompute) seconds of one block over one micro-batch."""
    peak, hbm = kind.bf16_dense_flops, HBM_BYTES_PER_S[kind.name] * _c("hbm_efficiency")
    n = costs["tokens"]
    mm = n * costs["matmul"] / (peak * _c("matmul_efficiency"))
    attn = n * costs["attention"] / (peak * _c("attention_efficiency"))
    ew = n * costs["bytes"] * (_c("compiled_bytes_factor") if compiled else 1.0) / hbm
    forward = mm + attn + ew
    backward = (mm + ew) * _c("backward_over_forward") + attn * _c("attention_backward_over_forward")
    share = 1.0 / every if ac == "full" else 1.0  # block:K recomputes 1 block in K
    recompute = {"none": 0.0, "full": forward * share, "op": ew}[ac]
    return forward, backward + recompute


def predict_step(cfg, world_size: int, nnodes: int, kind: GpuKind, counts=None) -> StepPrediction:
    """Seconds per optimizer step of cfg (resolved for the GPU) on `kind`; see the module docstring."""
    from trainer.config.perf import compile_blocks, parse_ac, prefetch_data
    from trainer.plan.accounting import _param_counts, comm_bytes

    counts = counts or _param_counts(cfg)
    costs = block_costs(cfg)
    ac = parse_ac(cfg.model.activation_checkpointing, "cuda")
    compiled, prefetch = compile_blocks(cfg, "cuda"), prefetch_data(cfg, "cuda")
    fwd, bwd = _block_seconds(costs, kind, compiled, ac.mode, ac.every)
    ga, depth = cfg.train.grad_accum, cfg.model.depth
    fit = fitted()
    parts = {
        "blocks_forward": ga * depth * fwd,
        "blocks_backward": ga * depth * bwd,
        "outside_blocks": ga * _nonblock_s(kind, costs["tokens"]),
        "optimizer": counts[1] / world_size * _c("optimizer_bytes_per_param")
        / (HBM_BYTES_PER_S[kind.name] * fit["optimizer_efficiency"]),
        "data": 0.0 if prefetch else ga * REFERENCE["data_s"] / REFERENCE["grad_accum"],
        "h2d": 0.0 if prefetch else ga * REFERENCE["h2d_s"] / REFERENCE["grad_accum"],
    }  # fmt: skip
    bf16 = cfg.train.mixed_precision in ("bf16", "auto")
    _, _, wire = comm_bytes(cfg, counts, world_size, 2 if bf16 else 4)
    link = kind.link_bytes_per_s if nnodes == 1 else min(kind.link_bytes_per_s, 50e9)
    compute = parts["blocks_forward"] + parts["blocks_backward"] + parts["outside_blocks"]
    comm = wire / link
    parts["comm_exposed"] = comm / max(1, depth) + max(0.0, comm - compute)
    step = sum(parts.values())
    model_flops = counts[4] * costs["tokens"] * ga
    return StepPrediction(kind.name, step, parts, model_flops, model_flops / (step * kind.bf16_dense_flops))


_FITTED: dict[str, float] = {}


def fitted() -> dict[str, float]:
    """The two constants fitted to REFERENCE (computed once, from the same model as the prediction)."""
    if _FITTED:
        return _FITTED
    from trainer.config import load_config
    from trainer.plan.accounting import _param_counts
    from trainer.plan.gpus import gpu_kind
    from trainer.plan.memory import target_config

    ref = load_config("furniture_train", False, {"model.pretrained": "", "model.depth": REFERENCE["depth"],
                      "train.grad_accum": REFERENCE["grad_accum"], "model.activation_checkpointing": "full",
                      "train.compile": "false", "train.data_path": "inline"})  # fmt: skip
    ref = target_config(ref, "cuda")
    kind = gpu_kind(REFERENCE["kind"])
    fwd, bwd = _block_seconds(block_costs(ref), kind, False, "full", 1)
    per_micro = REFERENCE["forward_backward_s"] / REFERENCE["grad_accum"]
    trained = _param_counts(ref)[1]
    moved = trained * _c("optimizer_bytes_per_param") / HBM_BYTES_PER_S[kind.name]
    _FITTED.update(
        nonblock_s=max(0.0, per_micro - REFERENCE["depth"] * (fwd + bwd)),
        optimizer_efficiency=moved / REFERENCE["optimizer_s"],
    )
    return _FITTED
