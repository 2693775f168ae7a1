"""train.compile: the per-block torch.compile path (Inductor C++ on this CPU) trains the same losses as
eager, keeps parameter names (checkpoints resume across the switch), and compiles once: the recipe's
per-micro-batch chunk and window redraws change mask values only, never a shape, so nothing recompiles.

The compile goes into the machine's Inductor cache for tests (tests/conftest.py run_inductor_cache): what
it may reuse was compiled by an earlier test or run; losses against eager hold whatever the cache holds."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

from tests.support.lingbot_tiny import TinyStream, tiny_cfg
from trainer.model import WorldModel
from trainer.model.parallel import clip_grad_norm, prepare_micro_step, shard_model

pytestmark = pytest.mark.heavy

STEPS, ACCUM = 3, 2
# Inductor fuses and reorders fp32 reductions: per-op differences ~1e-6, amplified a little by 3 AdamW
# steps at lr 3e-3; 1e-3 relative is far below the step-to-step change of the loss (~1e-1).
RTOL = 1e-3


def run(compiled: bool, init_file) -> tuple[list[float], list[int], list[str], list[set[int]]]:
    """Losses per step, Dynamo's unique graph count after each step, parameter names, chunk sizes seen."""
    cfg = tiny_cfg(
        **{"train.grad_accum": ACCUM, "train.lr": 3e-3, "model.attention": "sdpa", "train.compile": compiled}
    )
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = shard_model(WorldModel(cfg), cfg, "cpu")
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
        stream = TinyStream(cfg)
        losses, graphs, chunks = [], [], []
        for step in range(STEPS):
            total, seen = 0.0, set()
            for micro in range(ACCUM):
                prepare_micro_step(model, cfg, micro)
                batch = stream.micro_batch(step, micro)
                seen.add(int(batch["frames_per_chunk"]))
                out = model(batch)
                (out["loss"] / ACCUM).backward()
                total += float(out["loss"].detach()) / ACCUM
            clip_grad_norm(model, cfg.train.grad_clip)
            opt.step()
            opt.zero_grad()
            losses.append(total)
            graphs.append(counters["stats"]["unique_graphs"])
            chunks.append(seen)
        names = [n for n, _ in model.named_parameters()]
    finally:
        dist.destroy_process_group()
    return losses, graphs, names, chunks


def test_compiled_blocks_train_the_eager_losses_without_recompiling(tmp_path, run_inductor_cache):
    torch._dynamo.reset()
    counters.clear()
    eager, eager_graphs, eager_names, chunks = run(False, tmp_path / "init0")
    assert eager_graphs == [0] * STEPS  # nothing compiled with the option off
    compiled, graphs, names, _ = run(True, tmp_path / "init1")
    assert len(set().union(*chunks)) > 1  # the redraws did change the chunk size between micro-batches
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=RTOL, atol=1e-6)
    assert graphs[0] >= 1  # the blocks were compiled ...
    assert graphs == [graphs[0]] * STEPS  # ... once: no new graph in later steps (no recompile)
    assert not counters["recompiles"]
    assert names == eager_names  # parameter names (the checkpoint keys) unchanged
    torch._dynamo.reset()
