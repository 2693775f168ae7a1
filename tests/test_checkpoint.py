"""checkpoint/checkpointer.py: what counts as complete, DCP save/load round trip, keep-K,
interrupted saves.

Runs in this process as a one-rank gloo group with a small fully_shard-ed model (the 2-rank behaviour
is covered end to end in test_resume.py). The resume check's free keys (data.latent_cache among them:
a run may resume across a change of it, once held end to end by test_diskspace.py's latent-cache case) are
test_resume_conflicts_name_what_changed's. The size estimate is checked against a real DCP checkpoint of
the cpu_scale model after one AdamW step on a synthetic micro-batch of the run's shapes (no dataset).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from trainer.checkpoint.checkpointer import (
    MARKER,
    SAFETENSORS,
    Checkpointer,
    latest_complete,
    resume_conflicts,
    scan,
)
from trainer.config import CheckpointConfig, load_config

pytestmark = pytest.mark.fast


def fake_complete(root, step: int, train_state: dict | None = None):
    """A directory that passes the completeness test (marker listing the files with their sizes)."""
    path = root / f"checkpoint_step_{step}"
    path.mkdir(parents=True)
    (path / "train_state.json").write_text(json.dumps(train_state or {"step": step}))
    files = {p.name: p.stat().st_size for p in path.iterdir()}
    (path / MARKER).write_text(json.dumps({"step": step, "files": files}))
    return path


def test_absent_empty_and_partial_dirs_are_a_fresh_start_with_the_reason(tmp_path):
    root = tmp_path / "checkpoints"
    assert latest_complete(root) is None
    assert scan(root) == ([], f"no checkpoint directory {root}")

    root.mkdir()
    assert latest_complete(root) is None
    assert "is empty" in scan(root)[1]
    (root / "checkpoint_step_2.damaged-20261206-1-1").mkdir()  # not "empty": said as moved aside
    assert "every one was moved aside as damaged (checkpoint_step_2.damaged-20261206-1-1)" in scan(root)[1]
    (root / "checkpoint_step_2.damaged-20261206-1-1").rmdir()

    (root / "checkpoint_step_8.tmp-123").mkdir()  # a save killed before its rename
    (root / "checkpoint_step_4").mkdir()  # a final name without COMPLETE
    truncated = fake_complete(root, 6)
    (truncated / "train_state.json").write_text("{}")  # size no longer what COMPLETE recorded
    wrong_step = fake_complete(root, 7)
    (wrong_step / MARKER).write_text(json.dumps({"step": 5, "files": {}}))
    assert latest_complete(root) is None
    reason = scan(root)[1]
    assert reason.startswith("only partial checkpoints")
    for name in ("checkpoint_step_8.tmp-123", "checkpoint_step_4", "checkpoint_step_6", "checkpoint_step_7"):
        assert name in reason

    fake_complete(root, 2)
    fake_complete(root, 10)
    assert latest_complete(root).step == 10
    assert [c.step for c in scan(root)[0]] == [2, 10]


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x).square().mean()


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def make_state(seed=0):
    torch.manual_seed(seed)
    model = Tiny()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: min(1.0, (done + 1) / 3))
    return model, optimizer, scheduler


def train_steps(model, optimizer, scheduler, n):
    for _ in range(n):
        model(torch.randn(4, 8)).backward()  # uses the global RNG: restoring it matters
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()


def snapshot(model, optimizer):
    params = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    moments = [s["exp_avg"].full_tensor().clone() for s in optimizer.state.values()]
    return params, moments


def test_save_then_load_restores_model_optimizer_schedule_and_rng(process_group, tmp_path):
    model, optimizer, scheduler = make_state()
    train_steps(model, optimizer, scheduler, 2)
    ckpt = Checkpointer(tmp_path, CheckpointConfig(keep=3), last_step=0, attempt="a1")
    info = ckpt.save(2, model, optimizer, scheduler, train_state={"config": {}, "losses": {}})
    params, moments = snapshot(model, optimizer)
    next_draw = torch.randn(3)
    last_lr = scheduler.get_last_lr()

    other_model, other_optimizer, other_scheduler = make_state(seed=1)  # different weights, no state
    torch.manual_seed(123)
    state = ckpt.load(info, other_model, other_optimizer, other_scheduler)
    assert state["step"] == 2 and state["world_size"] == 1
    got_params, got_moments = snapshot(other_model, other_optimizer)
    assert all(torch.equal(params[k], got_params[k]) for k in params)
    assert all(torch.equal(a, b) for a, b in zip(moments, got_moments, strict=True))
    assert other_scheduler.get_last_lr() == last_lr and other_scheduler.last_epoch == scheduler.last_epoch
    assert torch.equal(torch.randn(3), next_draw)


def test_keep_last_k_and_stale_partials_are_removed(process_group, tmp_path):
    model, optimizer, scheduler = make_state()
    (tmp_path / "checkpoint_step_99.tmp-dead").mkdir()
    ckpt = Checkpointer(tmp_path, CheckpointConfig(keep=2), last_step=0, attempt="a2")
    for step in (1, 2, 3, 4):
        ckpt.save(step, model, optimizer, scheduler, train_state={})
    assert [c.step for c in scan(tmp_path)[0]] == [3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_step_3", "checkpoint_step_4"]


def test_a_save_interrupted_before_commit_leaves_the_previous_checkpoint_latest(process_group, tmp_path):
    model, optimizer, scheduler = make_state()
    ckpt = Checkpointer(tmp_path, CheckpointConfig(keep=3), last_step=0, attempt="a3")
    ckpt.save(5, model, optimizer, scheduler, train_state={})

    def die():
        raise KeyboardInterrupt("killed mid-write")

    with pytest.raises(KeyboardInterrupt):
        ckpt.save(6, model, optimizer, scheduler, train_state={}, before_commit=die)
    assert (tmp_path / "checkpoint_step_6.tmp-a3").is_dir()  # the half-written save is still there
    assert not (tmp_path / "checkpoint_step_6").exists()
    assert latest_complete(tmp_path).step == 5


def test_safetensors_export_is_part_of_the_complete_checkpoint(process_group, tmp_path):
    from safetensors.torch import load_file

    model, optimizer, scheduler = make_state()
    ckpt = Checkpointer(
        tmp_path, CheckpointConfig(keep=1, export_safetensors=True), last_step=0, attempt="a4"
    )
    info = ckpt.save(1, model, optimizer, scheduler, train_state={})
    weights = load_file(str(info.path / SAFETENSORS))
    assert set(weights) == set(model.state_dict())
    assert torch.equal(weights["head.weight"], model.state_dict()["head.weight"].full_tensor())
    assert SAFETENSORS in json.loads((info.path / MARKER).read_text())["files"]


def test_resume_conflicts_name_what_changed():
    cfg = load_config("furniture_train", cpu_scale=True)
    saved = {"config": cfg.to_dict(), "world_size": 2}
    assert resume_conflicts(saved, cfg, 2) == []
    longer = load_config(
        "furniture_train", cpu_scale=True, overrides={"train.steps": "80", "train.lr": "1e-4"}
    )
    assert resume_conflicts(saved, longer, 2) == []  # more steps, another LR: a legitimate resume
    uncached = load_config("furniture_train", cpu_scale=True, overrides={"data.latent_cache": "false"})
    assert uncached.data.latent_cache != cfg.data.latent_cache
    assert resume_conflicts(saved, uncached, 2) == []  # the same data, encoded elsewhere (test_diskspace.py)
    moved = load_config("furniture_train", cpu_scale=True, overrides={"data.cache_dir": "/big/disk"})
    assert resume_conflicts(saved, moved, 2) == []  # the out-of-space fix (a review: it refused the resume)
    dim = cfg.model.dim
    new_dim = dim * 3 // 2  # a head dim whose third is still even (the reference's 3-D RoPE)
    wider = load_config("furniture_train", cpu_scale=True, overrides={"model.dim": str(new_dim)})
    problems = resume_conflicts(saved, wider, 4)
    assert any(f"model.dim was {dim}, is now {new_dim}" in p for p in problems)
    assert any("written by 2 ranks, this run has 4" in p for p in problems)
    assert "--run-dir" in problems[-1]


def test_asynchronous_save_is_committed_by_the_next_save_or_finish(process_group, tmp_path):
    model, optimizer, scheduler = make_state()
    ckpt = Checkpointer(tmp_path, CheckpointConfig(keep=3), last_step=0, attempt="a5")
    assert ckpt.save(1, model, optimizer, scheduler, train_state={}, asynchronous=True) is None
    params, _ = snapshot(model, optimizer)
    train_steps(model, optimizer, scheduler, 1)  # training goes on while step 1 is written
    assert latest_complete(tmp_path) is None  # in flight: not complete yet
    ckpt.save(2, model, optimizer, scheduler, train_state={}, asynchronous=True)
    assert latest_complete(tmp_path).step == 1 and ckpt.last_committed.step == 1
    assert ckpt.finish().step == 2 and ckpt.finish() is None
    assert [c.step for c in scan(tmp_path)[0]] == [1, 2]

    other_model, other_optimizer, other_scheduler = make_state(seed=1)
    ckpt.load(scan(tmp_path)[0][0], other_model, other_optimizer, other_scheduler)
    got, _ = snapshot(other_model, other_optimizer)
    assert all(torch.equal(params[k], got[k]) for k in params)  # step 1's weights, not later ones


def test_complete_records_the_sha256_of_every_file(process_group, tmp_path):
    from trainer.checkpoint.layout import file_sha256

    model, optimizer, scheduler = make_state()
    info = Checkpointer(tmp_path, CheckpointConfig(keep=2), last_step=0, attempt="c1").save(
        1, model, optimizer, scheduler, train_state={}
    )
    marker = json.loads((info.path / MARKER).read_text())
    names = sorted(p.name for p in info.path.iterdir() if p.name != MARKER)
    assert sorted(marker["sha256"]) == sorted(marker["files"]) == names
    assert all(marker["sha256"][n] == file_sha256(info.path / n) for n in names)


def test_a_damaged_checkpoint_is_named_moved_aside_and_the_newest_intact_one_resumes(process_group, tmp_path):
    from trainer.checkpoint.layout import quarantine_damaged

    model, optimizer, scheduler = make_state()
    ckpt = Checkpointer(tmp_path, CheckpointConfig(keep=3), last_step=0, attempt="d1")
    for step in (2, 4, 6):
        ckpt.save(step, model, optimizer, scheduler, train_state={})
    shard = next((tmp_path / "checkpoint_step_6").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    shard.write_bytes(bytes(data))
    with open(next((tmp_path / "checkpoint_step_4").glob("*.distcp")), "r+b") as f:
        f.truncate(10)  # a truncated file: its size already tells
    moved = quarantine_damaged(tmp_path)
    assert sorted((d.step, "sha256" in d.problem or "bytes" in d.problem) for d in moved) == [
        (4, True),
        (6, True),
    ]
    assert all(Path(d.moved_to).is_dir() and not Path(d.path).exists() for d in moved)  # kept, not deleted
    assert [c.step for c in scan(tmp_path)[0]] == [2]
    ckpt.save(8, model, optimizer, scheduler, train_state={})  # pruning never removes what was moved aside
    assert all(Path(d.moved_to).is_dir() for d in moved)


def test_the_size_estimate_is_within_10_percent_of_a_real_checkpoint(process_group, tmp_path):
    from trainer.checkpoint.size import estimate_bytes, model_size
    from trainer.model.parallel import build_model
    from trainer.plan.memory import synthetic_micro_batch

    cfg = load_config("furniture_train", cpu_scale=True)
    model = build_model(cfg, torch.device("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: 1.0)
    model(synthetic_micro_batch(cfg))["loss"].backward()  # the run's shapes; the data plays no part
    optimizer.step()  # AdamW's moments exist from the first step on
    info = Checkpointer(tmp_path, CheckpointConfig(keep=1), last_step=0, attempt="e1").save(
        1, model, optimizer, scheduler, train_state={"config": cfg.to_dict(), "losses": {}}
    )
    real = sum(p.stat().st_size for p in info.path.iterdir())
    estimate = estimate_bytes(cfg, model_size(cfg), 1)
    assert abs(estimate - real) / real < 0.10, (estimate, real)


@pytest.mark.fast
def test_a_save_is_refused_when_a_parameter_or_moment_is_not_finite(process_group, tmp_path):
    from trainer.checkpoint.checkpointer import NonFiniteState

    model, optimizer, scheduler = make_state()
    train_steps(model, optimizer, scheduler, 1)
    ckpt = Checkpointer(tmp_path, CheckpointConfig(keep=1), last_step=0, attempt="n1")
    ckpt.save(1, model, optimizer, scheduler, train_state={})
    assert json.loads((tmp_path / "checkpoint_step_1" / MARKER).read_text())["finite"] is True
    with torch.no_grad():
        model.head.bias.to_local().fill_(float("nan"))
    with pytest.raises(NonFiniteState, match="checkpoint step 2 refused: head.bias holds non-finite"):
        ckpt.save(2, model, optimizer, scheduler, train_state={})
    assert [c.step for c in scan(tmp_path)[0]] == [1]  # the finite one is kept, nothing half-written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_step_1"]
    with torch.no_grad():
        model.head.bias.to_local().zero_()
        next(iter(optimizer.state.values()))["exp_avg"].to_local().fill_(float("inf"))
    with pytest.raises(NonFiniteState, match="optimizer exp_avg of blocks.0.weight"):
        ckpt.save(3, model, optimizer, scheduler, train_state={})


def test_a_stop_while_the_cache_is_prepared_again_keeps_the_runs_last_checkpoint(process_group, tmp_path):
    """A cache prepared again (its data settings changed) after checkpoints, stopped: the summary and the
    rank's record keep the run's last complete checkpoint (the next attempt resumes from it), not
    `null`/step 0 (found by a review; tests/test_prepare_stop.py holds the fresh run's stop end to end)."""
    import signal

    from trainer.data.cache.store import PreparationStopped
    from trainer.loop.observe import stopped_in_preparation
    from trainer.loop.rank import STOP_SIGNALS, StopRequest

    model, optimizer, scheduler = make_state()
    ckpt = Checkpointer(tmp_path / "checkpoints", CheckpointConfig(keep=2), last_step=0, attempt="a9")
    ckpt.save(3, model, optimizer, scheduler, train_state={})
    handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        stop = StopRequest(None)
        stop.signal_name = "SIGUSR1"
        cfg = load_config("furniture_train", cpu_scale=True)
        state = stopped_in_preparation(cfg, tmp_path, None, stop, PreparationStopped("1 of 4 kept"), 0.0)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert state.status == "preempted"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["reason"] == "stopped while preparing the latent cache (received SIGUSR1): 1 of 4 kept"
    assert summary["last_complete_checkpoint"]["step"] == 3 and summary["last_step"] is None
