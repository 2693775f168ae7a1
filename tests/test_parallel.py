"""FSDP2 on 2 gloo ranks: reduce-scatter every micro-step vs only the last, with parameters resharded
between micro-steps or kept gathered, all give the same loss curve, and match one unsharded process that
sees both ranks' micro-batches."""

import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.support.lingbot_tiny import TinyStream, tiny_cfg
from trainer.config import RunConfig
from trainer.model import WorldModel
from trainer.model.parallel import (
    clip_grad_norm,
    mixed_precision_policy,
    prepare_micro_step,
    set_grad_sync,
    shard_model,
)

WORLD, STEPS, ACCUM = 2, 3, 3
# The variants differ only in float summation order (local sum then reduce vs reduce then sum):
# the losses agree to ~1e-6 relative; 1e-4 leaves room for Adam to amplify that over 3 steps.
RTOL, ATOL = 1e-4, 1e-6


def small_cfg():
    return tiny_cfg(**{"train.grad_accum": ACCUM, "train.lr": 3e-3, "train.batch_size": 1})


def train(model, streams, cfg, grad_sync, divide, sharded=False):
    """The minimal loop: accumulate ACCUM micro-steps, clip, AdamW. Returns per-step losses per stream.
    `sharded`: set sync/reshard per micro-step with prepare_micro_step, as trainer/loop/train.py does."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    curves: list[list[float]] = [[] for _ in streams]
    for step in range(STEPS):
        totals = [0.0 for _ in streams]
        for micro in range(ACCUM):
            if sharded:
                prepare_micro_step(model, cfg, micro)
            else:
                set_grad_sync(model, grad_sync == "every" or micro == ACCUM - 1)
            for i, stream in enumerate(streams):
                out = model(stream.micro_batch(step, micro))
                (out["loss"] / divide).backward()
                totals[i] += float(out["loss"].detach()) / ACCUM
        clip_grad_norm(model, cfg.train.grad_clip)
        opt.step()
        opt.zero_grad()
        for i, t in enumerate(totals):
            curves[i].append(t)
    return curves


def _rank_main(rank, init_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    cfg = small_cfg()
    stream = TinyStream(cfg, rank, repeat=True)
    result = {}
    for grad_sync in ("every", "last"):
        for keep in (False, True):
            cfg.train.grad_sync, cfg.train.keep_params_gathered = grad_sync, keep
            torch.manual_seed(0)
            model = shard_model(WorldModel(cfg), cfg, torch.device("cpu"))
            # FSDP averages gradients over ranks, so each rank divides by ACCUM only
            (curve,) = train(model, [stream], cfg, grad_sync, divide=ACCUM, sharded=True)
            gathered = [None] * WORLD
            dist.all_gather_object(gathered, curve)
            result[f"{grad_sync}-{'kept' if keep else 'resharded'}"] = gathered
    if rank == 0:
        (out_dir / "losses.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.heavy
@pytest.mark.slow
def test_grad_sync_last_equals_every_and_unsharded(tmp_path):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_rank_main, args=(tmp_path / "init", tmp_path), nprocs=WORLD, join=True)
    result = json.loads((tmp_path / "losses.json").read_text())

    # reference: one unsharded model that runs both ranks' micro-batches, averaging over ranks
    cfg = small_cfg()
    torch.manual_seed(0)
    reference = train(
        WorldModel(cfg),
        [TinyStream(cfg, r, repeat=True) for r in range(WORLD)],
        cfg,
        "every",
        divide=ACCUM * WORLD,
    )
    assert len(result) == 4
    for rank in range(WORLD):
        every = result["every-resharded"][rank]
        assert len(every) == STEPS
        torch.testing.assert_close(torch.tensor(every), torch.tensor(reference[rank]), rtol=RTOL, atol=ATOL)
        for variant, curves in result.items():
            torch.testing.assert_close(
                torch.tensor(curves[rank]),
                torch.tensor(every),
                rtol=RTOL,
                atol=ATOL,
                msg=f"variant {variant} differs from every-resharded",
            )
    every = result["every-resharded"]
    assert every[0] != every[1]  # the ranks saw different data
    assert every[0][-1] < every[0][0]  # and it trained


@pytest.mark.fast
def test_mixed_precision_policy_per_device():
    cfg = RunConfig()
    assert mixed_precision_policy(cfg, torch.device("cpu")).param_dtype == torch.float32
    gpu = mixed_precision_policy(cfg, torch.device("cuda"))
    assert gpu.param_dtype == torch.bfloat16 and gpu.reduce_dtype == torch.float32
    cfg.train.mixed_precision = "bf16"
    assert mixed_precision_policy(cfg, torch.device("cpu")).param_dtype == torch.bfloat16


@pytest.mark.fast
def test_shard_model_needs_a_process_group():
    if dist.is_initialized():
        pytest.skip("a process group exists in this test process")
    with pytest.raises(RuntimeError, match="torchrun"):
        shard_model(torch.nn.Linear(2, 2), RunConfig(), torch.device("cpu"))
