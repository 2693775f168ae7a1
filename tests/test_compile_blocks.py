"""Compiled blocks in torchtitan's order (activation checkpointing, then torch.compile, then fully_shard):
no graph break and no recompile over redrawn chunk/window draws, on the CPU Inductor path (the code CUDA
runs; trainer/model/parallel.py). fullgraph=True makes a break an error; the counters prove it besides.

Op-level selective checkpointing (the hardest case: a selective-checkpoint context inside the compiled
graph) trains 3 steps x 2 micro-batches with sdpa (CPU FlexAttention has no backward in torch 2.13); the
flex path, traced into the compiled block, runs forward over 6 redrawn micro-batches.

Both compile into the machine's Inductor cache for tests (tests/conftest.py run_inductor_cache: what a
run reuses was compiled by an earlier test or run); the claims are Dynamo's counters, which count every
graph whatever the cache holds."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

from tests.support.lingbot_tiny import TinyStream, tiny_cfg
from trainer.model import WorldModel
from trainer.model.parallel import prepare_micro_step, shard_model

pytestmark = pytest.mark.heavy


def _fresh() -> None:
    torch._dynamo.reset()
    counters.clear()


def test_op_level_checkpointed_compiled_blocks_never_break_or_recompile(tmp_path, run_inductor_cache):
    _fresh()
    cfg = tiny_cfg(
        **{"model.attention": "sdpa", "train.compile": "true", "model.activation_checkpointing": "op"}
    )
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        model = shard_model(WorldModel(cfg), cfg, "cpu")
        stream, graphs, draws = TinyStream(cfg), [], set()
        for step in range(3):
            for micro in range(cfg.train.grad_accum):
                prepare_micro_step(model, cfg, micro)
                batch = stream.micro_batch(step, micro)
                draws.add((int(batch["frames_per_chunk"]), int(batch["window"])))
                model(batch)["loss"].backward()
            graphs.append(counters["stats"]["unique_graphs"])
        wrapped = [type(b).__name__ for b in model.blocks]
    finally:
        dist.destroy_process_group()
    assert len(draws) > 2  # chunk and window really were redrawn
    assert graphs[0] >= 1 and graphs == [graphs[0]] * 3, graphs  # compiled, then never again
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert not counters["recompiles"], dict(counters["recompiles"])
    assert all("CheckpointWrapper" in name for name in wrapped), wrapped  # AC outside, then compile
    torch._dynamo.reset()


def test_flex_attention_traces_into_the_compiled_block(tmp_path, run_inductor_cache):
    _fresh()
    cfg = tiny_cfg(**{"model.attention": "flex", "train.compile": "true"})
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        model = shard_model(WorldModel(cfg), cfg, "cpu")
        model.set_attention_backend("flex", compiled=True)
        stream, graphs, windows = TinyStream(cfg), [], set()
        with torch.no_grad():
            for micro in range(6):
                batch = stream.micro_batch(0, micro)
                windows.add(int(batch["window"]))
                model(batch)
                graphs.append(counters["stats"]["unique_graphs"])
    finally:
        dist.destroy_process_group()
    assert len(windows) > 1
    assert graphs == [graphs[0]] * 6, graphs
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert not counters["recompiles"], dict(counters["recompiles"])
    torch._dynamo.reset()
