"""Compiled FlexAttention with the LingBot mask alone, forward + backward, at the cluster config's shapes:
which variant runs on this GPU. Each variant runs in its own process (a CUDA illegal memory access
poisons the context), and the result of each is one JSON line.

    python bench/flex_probe.py [--variants as_is,padded_ids,plain_mask,eager] [--layers-heads 24]

Variants:
  as_is       the model's call: the layout's id tensors captured by the mask_mod, torch.compile(flex)
  padded_ids  the same ids, each captured tensor extended by 1024 padding entries (a kernel that reads
              past the sequence then reads padding, not foreign memory)
  plain_mask  a mask_mod with no captured tensor (q_idx >= 0): the kernel alone at this length
  eager       the same as as_is without torch.compile (flex's reference path; slow, memory-hungry)
  strided_grad  as_is, with the output transposed as the model does, so the backward's grad_out is strided
Found on the first GPU check (H200, torch 2.11.0+cu130, Triton 3.6): the model's compiled flex backward
raised `CUDA error: an illegal memory access` (bench/results/2026-12-04-gpu-check.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = ("as_is", "padded_ids", "plain_mask", "eager", "strided_grad")


def run_variant(name: str, heads: int) -> dict:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from bench.gpu_measure import check_config
    from trainer.model.masks import PAD, SequenceShape, lingbot_mask_mod, token_layout

    cfg = check_config(4, 2)
    m, d = cfg.model, cfg.data
    device = torch.device("cuda", 0)
    side = m.latent_size // m.patch
    shape = SequenceShape(d.frames, side * side * len(d.cameras), d.actions_per_frame)
    layout = token_layout(shape, 1, torch.tensor(2, device=device), m.attn_block, device)
    window = torch.tensor(4, device=device)
    if name == "padded_ids":
        extra = 1024

        def grow(t: torch.Tensor, value: int) -> torch.Tensor:
            return torch.cat([t, torch.full((extra,), value, dtype=t.dtype, device=device)])

        layout = type(layout)(
            seq_ids=grow(layout.seq_ids, PAD),
            block_ids=grow(layout.block_ids, 0),
            noise_ids=grow(layout.noise_ids, 0),
            frame_ids=layout.frame_ids,
            sections=layout.sections,
        )
    length = layout.sections and sum(layout.sections)
    mask_mod = (lambda b, h, q, kv: q >= 0) if name == "plain_mask" else lingbot_mask_mod(layout, window)
    block_mask = create_block_mask(
        mask_mod, None, None, length, length, device=device, BLOCK_SIZE=m.attn_block
    )
    attend = flex_attention if name == "eager" else torch.compile(flex_attention, dynamic=False)
    head_dim = m.dim // m.heads
    q, k, v = (
        torch.randn(1, heads, length, head_dim, device=device, dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    t0 = time.perf_counter()
    for _ in range(2):
        out = attend(q, k, v, block_mask=block_mask)
        if name == "strided_grad":  # the model's path: (B, H, L, D) -> (B, L, H * D), so grad_out is strided
            out = out.transpose(1, 2).reshape(1, length, heads * head_dim)
        out.float().square().mean().backward()
    torch.cuda.synchronize()
    return {"length": length, "head_dim": head_dim, "heads": heads, "seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--heads", type=int, default=24)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps({"variant": args.one, "ok": True, **run_variant(args.one, args.heads)}), flush=True)
        return 0
    failed = 0
    for name in args.variants.split(","):
        cmd = [sys.executable, __file__, "--one", name, "--heads", str(args.heads)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode == 0 and lines:
                print(lines[-1], flush=True)
                continue
            errors = [ln for ln in proc.stderr.splitlines() if "Error" in ln][-2:]
            print(
                json.dumps({"variant": name, "ok": False, "rc": proc.returncode, "error": errors}), flush=True
            )
        except subprocess.TimeoutExpired:
            print(
                json.dumps({"variant": name, "ok": False, "error": f"timeout {args.timeout} s"}), flush=True
            )
        failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
