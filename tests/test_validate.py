"""Held-out validation on 2 CPU ranks (trainer/loop/validate.py): the numbers do not depend on the rank count,
training after an evaluation continues bit for bit as without it, and a run ends with its held-out losses
and its best checkpoint in metrics.jsonl, TensorBoard, summary.json and the log.

Across a resume (an evaluated run resumed: the same training and the same held-out losses, bit for bit):
tests/test_resume.py::test_kill9_of_one_rank_mid_checkpoint_fails_naming_it_and_keeps_the_previous_checkpoint
(resumed from checkpoint 2, written after an evaluation) and
test_resume.py::test_sigterm_during_a_step_then_during_a_checkpoint_write_resumes_bitwise compare every
step's losses, grad_norm, lr and held-out losses with an uninterrupted run that evaluates at 2, 4 and 6."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.support.runs import launcher_argv, seed_preflight

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "model.dim=48", "model.heads=2", "model.depth=2", "model.latent_size=8", "model.attn_block=16",
    "data.frames=4", "data.generated_episodes=6", "data.generated_length=20",
    "train.grad_accum=2", "train.warmup_steps=2", "checkpoint.every=2", "checkpoint.keep=1",
]  # fmt: skip
TIMEOUT = 900  # a tiny run takes ~1 min; a shared machine under load takes much longer

pytestmark = pytest.mark.heavy


def start(
    run_dir: Path, data_dir: Path, *sets: str, nproc: int = 2, record: Path | None = None
) -> subprocess.Popen:
    if record is not None:  # the session's compile-check pass (tests/support/runs.py); not a preflight test
        seed_preflight(run_dir, record)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LINGBOT_", "SLURM_", "CONDA_PREFIX"))}
    env["CONDA_ENVS_PATH"] = str(run_dir.parent / "no-envs")  # no provisioned env: the tool env
    env["OMP_NUM_THREADS"] = "1"
    argv = launcher_argv(run_dir, nproc)
    for item in [*TINY, f"data.path={data_dir}", *sets]:
        argv += ["--set", item]
    return subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen) -> str:
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out + err
    return out


def run(run_dir: Path, data_dir: Path, *sets: str, nproc: int = 2, record: Path | None = None) -> str:
    return finish(start(run_dir, data_dir, *sets, nproc=nproc, record=record))


def records(run_dir: Path) -> dict[int, dict]:
    """Per step, the metrics.jsonl record of the last attempt that ran it."""
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def training(record: dict) -> tuple:
    return record["latent_loss"], record["action_loss"], record["grad_norm"], record["lr"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("episodes") / "furniture"


@pytest.fixture(scope="module")
def validated(tmp_path_factory, data_dir, preflight_record) -> tuple[Path, str]:
    run_dir = tmp_path_factory.mktemp("validated") / "run"
    return run_dir, run(run_dir, data_dir, "train.steps=4", record=preflight_record)


def test_validation_is_logged_and_the_best_checkpoint_kept(validated):
    run_dir, out = validated
    by_step = records(run_dir)
    assert sorted(by_step) == [1, 2, 3, 4]
    val = {s: r["val_action_loss"] for s, r in by_step.items() if "val_action_loss" in r}
    assert sorted(val) == [2, 4]  # at every checkpoint, the last step included
    assert all(r["timing"]["eval_s"] > 0 for s, r in by_step.items() if s in val)
    assert all(r["timing"]["eval_s"] == 0 for s, r in by_step.items() if s not in val)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["validation"]["step"] == 4 and summary["validation"]["action_loss"] == val[4]
    assert summary["validation"]["episodes"] == 2 and summary["data"]["split"]["val_episodes"] == 2
    assert len(summary["data"]["split"]["held_out"]) == 2
    assert 0 <= summary["timing"]["eval_share"] < 1
    best_step = min(val, key=lambda s: (val[s], s))
    best = summary["best_checkpoint"]
    assert (best["step"], best["metric"], best["value"]) == (best_step, "val_action_loss", val[best_step])
    link = run_dir / "checkpoints" / "best"
    assert link.is_symlink() and link.resolve().name == f"checkpoint_step_{best_step}"
    assert (link / "COMPLETE").is_file()
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if not p.is_symlink())
    assert kept == sorted({f"checkpoint_step_{best_step}", "checkpoint_step_4"})  # keep=1, plus the best
    tail = out.strip().splitlines()[-6:]
    assert any("held-out (2 episodes" in line and "action_loss" in line for line in tail), out
    assert any("best checkpoint by val_action_loss" in line and f"step {best_step}" in line for line in tail)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("val/action_loss")] == [2, 4]


def test_training_after_an_evaluation_is_bit_for_bit_the_same(
    validated, tmp_path, data_dir, preflight_record
):
    run_dir, _ = validated
    expected = records(run_dir)
    plain = tmp_path / "plain"
    run(plain, data_dir, "train.steps=4", "checkpoint.validate=false", record=preflight_record)
    got = records(plain)
    assert {s: training(r) for s, r in got.items()} == {s: training(r) for s, r in expected.items()}
    assert not any(k.startswith("val_") for r in got.values() for k in r)  # no evaluation at all
    assert json.loads((plain / "summary.json").read_text())["validation"] is None
    # across a resume, the held-out losses included: tests/test_resume.py (the module docstring)


def _rank_main(rank: int, world: int, init_file: Path, data_dir: Path, out: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from trainer.config import load_config
    from trainer.data.stream import build_stream
    from trainer.loop.timing import StepBreakdown
    from trainer.loop.validate import evaluate
    from trainer.model import WorldModel
    from trainer.model.parallel import shard_model

    overrides = dict(item.split("=", 1) for item in TINY)
    cfg = load_config("furniture_train", cpu_scale=True, overrides={**overrides, "data.path": str(data_dir)})
    torch.manual_seed(0)
    model = shard_model(WorldModel(cfg), cfg, torch.device("cpu"))
    rig = SimpleNamespace(
        cfg=cfg, stream=build_stream(cfg, rank, world), device=torch.device("cpu"), world_size=world,
        rank=rank, model=model, breakdown=StepBreakdown(torch.device("cpu")),
    )  # fmt: skip
    first, second = evaluate(rig, 7), evaluate(rig, 7)
    if rank == 0:
        assert first is not None and second is not None
        out.write_text(json.dumps([first.to_json(), second.to_json()]))
    dist.barrier()
    dist.destroy_process_group()


def test_held_out_losses_do_not_depend_on_the_rank_count(tmp_path, data_dir):
    from trainer.config import load_config
    from trainer.data.stream import ensure_dataset

    overrides = dict(item.split("=", 1) for item in TINY)
    ensure_dataset(load_config("furniture_train", True, {**overrides, "data.path": str(data_dir)}))
    results = {}
    for world in (1, 2):
        out = tmp_path / f"world{world}.json"
        args = (world, tmp_path / f"init{world}", data_dir, out)
        mp.spawn(_rank_main, args=args, nprocs=world, join=True)
        results[world] = json.loads(out.read_text())
    for world, (first, second) in results.items():
        assert (first["latent_loss"], first["action_loss"]) == (second["latent_loss"], second["action_loss"])
        assert first["clips"] == results[1][0]["clips"] > 1 and first["episodes"] == 2, world
    one, two = results[1][0], results[2][0]
    assert two["latent_loss"] == pytest.approx(one["latent_loss"], rel=1e-9, abs=0)
    assert two["action_loss"] == pytest.approx(one["action_loss"], rel=1e-9, abs=0)
