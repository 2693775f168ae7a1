"""Attention with the LingBot-VA mask: compiled flex vs dense-mask sdpa vs eager flex vs naive.

Sequence lengths 1k-8k of one packed sample (60 video + 4 action tokens per frame, frames_per_chunk 2,
window 4: the mask's rules from trainer/model/masks.py). Forward, and forward+backward where the backend
supports it (FlexAttention has no backward on CPU with torch 2.13). Time is the median of a few calls
after a warm-up (for compiled flex: after its compilation, which is timed separately); memory is the
peak above the level before the call (GPU: max_memory_allocated; CPU: sampled process RSS).

    .venv/bin/python bench/bench_attention.py [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, PeakMemory, Table, median  # noqa: E402

TOKENS_PER_FRAME, ACTIONS_PER_FRAME, FRAMES_PER_CHUNK, WINDOW = 60, 4, 2, 4


def naive_attention(q, k, v, allowed):
    """softmax(QK^T/sqrt(d) masked) V with the (L, L) score matrix materialised; empty rows give 0."""
    import torch

    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return probs @ v


def _timed(fn, device) -> tuple[float, float]:
    """(median seconds, peak bytes above the starting level) of fn() after one warm-up call;
    3 timed calls, or 1 when the warm-up took over 2 s."""
    import torch

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    fn()
    sync()
    repeats = 1 if time.perf_counter() - t0 > 2 else 3
    times = []
    with PeakMemory(device) as mem:
        base = mem.peak if device.type != "cuda" else torch.cuda.memory_allocated()
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
    return median(times), max(0, mem.peak - base)


def run(quick: bool = False) -> list[Table]:
    """Measures in a fresh subprocess whose large allocations are mmap'ed, so that on CPU the process's
    RSS falls when a buffer is freed and its peak is the call's own working memory."""
    with tempfile.TemporaryDirectory(prefix="bench_attention_") as tmp:
        out = Path(tmp) / "table.json"
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(REPO)}
        cmd = [sys.executable, __file__, "--worker", str(out)] + (["--quick"] if quick else [])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"bench_attention worker exited {proc.returncode}:\n{proc.stderr[-4000:]}")
        return [Table(**json.loads(out.read_text()))]


def measure(quick: bool) -> Table:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from trainer.model.attention import _compiled_flex_attention, flex_backward_error
    from trainer.model.masks import SequenceShape, dense_mask, lingbot_mask_mod, token_layout

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    heads, head_dim = (24, 64) if cuda else (4, 32)
    lengths = [1024, 2048] if quick else [1024, 2048, 4096, 8192]
    # On CPU the backends that materialise the (L, L) scores take tens of seconds per call beyond 4k.
    materialising, cpu_limit = ("naive", "flex eager"), 4096
    bwd_error = flex_backward_error(device.type)
    compiled = _compiled_flex_attention()
    rows, skipped, compile_s = [], [], {}

    for length in lengths:
        frames = length // (2 * (TOKENS_PER_FRAME + ACTIONS_PER_FRAME))
        shape = SequenceShape(
            frames=frames, tokens_per_frame=TOKENS_PER_FRAME, actions_per_frame=ACTIONS_PER_FRAME
        )
        layout = token_layout(shape, 1, FRAMES_PER_CHUNK, pad_to=128, device=device)
        mask_mod = lingbot_mask_mod(layout, WINDOW)
        t0 = time.perf_counter()
        block_mask = create_block_mask(mask_mod, None, None, layout.length, layout.length, device=device)
        block_mask_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        allowed = dense_mask(mask_mod, layout.length, device)
        dense_mask_s = time.perf_counter() - t0
        block_mask_bytes = sum(t.numel() * t.element_size() for t in vars(block_mask).values()
                               if isinstance(t, torch.Tensor))  # fmt: skip
        density = allowed.float().mean().item()
        sdpa_mask = allowed | ~allowed.any(-1, keepdim=True)  # rows with no key attend all, then zeroed

        g = torch.Generator(device=device).manual_seed(0)
        q, k, v = (torch.randn(1, heads, layout.length, head_dim, device=device, dtype=dtype, generator=g)
                   for _ in range(3))  # fmt: skip

        backends = {
            "flex compiled": (functools.partial(compiled, block_mask=block_mask), bwd_error is None),
            "sdpa dense mask": (functools.partial(F.scaled_dot_product_attention, attn_mask=sdpa_mask), True),
            "flex eager": (functools.partial(flex_attention, block_mask=block_mask), bwd_error is None),
            "naive": (functools.partial(naive_attention, allowed=allowed), True),
        }
        t0 = time.perf_counter()
        backends["flex compiled"][0](q, k, v)  # compile for this shape (dynamic=False: one per length)
        compile_s[length] = time.perf_counter() - t0
        for name, (fn, has_backward) in backends.items():
            for mode in ("fwd", "fwd+bwd"):
                if mode == "fwd+bwd" and not has_backward:
                    skipped.append(f"{name} fwd+bwd: {bwd_error}")
                    continue
                if not cuda and name in materialising and length > cpu_limit:
                    skipped.append(f"{name} {mode} at {length}: materialises the full score matrix; "
                                   f"tens of seconds per call on this CPU")  # fmt: skip
                    continue
                if mode == "fwd":

                    def call(fn=fn, q=q, k=k, v=v):
                        with torch.no_grad():
                            fn(q, k, v)
                else:
                    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))

                    def call(fn=fn, qg=qg, kg=kg, vg=vg):
                        fn(qg, kg, vg).float().sum().backward()

                seconds, peak = _timed(call, device)
                rows.append([length, f"{density:.3f}", name, mode, seconds * 1e3, peak / 2**20])
        rows.append([length, f"{density:.3f}", "(build BlockMask: time, size)", "-", block_mask_s * 1e3,
                     block_mask_bytes / 2**20])  # fmt: skip
        rows.append([length, f"{density:.3f}", "(build dense mask: time, size)", "-", dense_mask_s * 1e3,
                     allowed.numel() * allowed.element_size() / 2**20])  # fmt: skip

    def at(length, name, mode):
        return next((r[4] for r in rows if r[0] == length and r[2] == name and r[3] == mode), None)

    longest = max(length for length in lengths if at(length, "sdpa dense mask", "fwd") is not None)
    flex, sdpa_ms = at(longest, "flex compiled", "fwd"), at(longest, "sdpa dense mask", "fwd")
    ratio = f"compiled flex / sdpa dense-mask forward at {longest} tokens = {flex / sdpa_ms:.2f}x time"
    unique_skips = sorted(set(skipped))
    table = Table(
        title=f"Attention, LingBot mask ({device.type}, {dtype}, {heads} heads x {head_dim}, "
        f"{TOKENS_PER_FRAME}+{ACTIONS_PER_FRAME} tokens/frame, window {WINDOW}, "
        f"torch threads {torch.get_num_threads()})",
        columns=["tokens", "mask density", "backend", "pass", "median ms", "peak MiB above start"],
        rows=rows,
        ratio=ratio,
        notes=[
            "flex compile time per length (dynamic=False): "
            + ", ".join(f"{n}: {s:.1f} s" for n, s in compile_s.items())
        ]  # fmt: skip
        + [f"skipped: {s}" for s in unique_skips],
    )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        args.worker.write_text(json.dumps(dataclasses.asdict(measure(args.quick))))
        return
    for table in run(args.quick):
        print(table.markdown())


if __name__ == "__main__":
    main()
