"""A diverged run says so (loop/divergence.py): real 2-rank runs through the launcher with a tiny model.

NaN is injected on one rank at known steps by the test hook LINGBOT_TEST_NAN_AT (trainer/testhooks.py):
under train.nonfinite=stop the run ends at that step (exit 1, one line, summary `failed` + `diverged`, no
checkpoint from it); under skip the update is dropped (the checkpoints before and after are equal) and
the run stops after too many in a row. A learning rate that diverges on its own stops the same way (on 1
rank: it diverges on every rank; the rank-specific blame is the stop and skip tests', on 2); a
checkpoint holding NaN (as an older version or a hand could write it) is refused in the preflight. The
fast tests check the blame and policy logic and the refused save in-process.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from tests.support.runs import launcher_argv, seed_preflight
from trainer.loop.divergence import APPLY, SKIP, STOP, NonfinitePolicy, SpikeWatch, blame
from trainer.outcomes import Diverged

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "model.dim=48", "model.heads=2", "model.depth=2", "model.latent_size=8", "model.attn_block=16",
    "data.frames=4", "data.generated_episodes=4", "data.generated_length=20",
    "train.grad_accum=1", "train.warmup_steps=0", "checkpoint.keep=5", "log.tensorboard=false",
]  # fmt: skip
TIMEOUT = 900  # a 2-rank tiny run takes ~1 min idle, several on a loaded 2-core machine


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("episodes") / "furniture"


def run(
    run_dir: Path,
    data_dir: Path,
    sets: list[str],
    nan_at: str | None = None,
    record: Path | None = None,
    nproc: int = 2,
) -> tuple[int, str]:
    if record is not None:  # the session's compile-check pass (tests/support/runs.py); not a preflight test
        seed_preflight(run_dir, record)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LINGBOT_", "SLURM_", "CONDA_PREFIX"))}
    env["CONDA_ENVS_PATH"] = str(run_dir.parent / "no-envs")  # no provisioned env: the tool env
    env["OMP_NUM_THREADS"] = "1"
    if nan_at:
        env["LINGBOT_TEST_NAN_AT"] = nan_at
    argv = launcher_argv(run_dir, nproc)  # python -m trainer.launcher furniture_train NPROC --run-dir RUN_DIR
    for item in [*TINY, f"data.path={data_dir}", *sets]:
        argv += ["--set", item]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    return proc.returncode, proc.stdout + proc.stderr


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def complete_steps(run_dir: Path) -> list[int]:
    found = (run_dir / "checkpoints").glob("checkpoint_step_*")
    return sorted(int(p.name.split("_")[-1]) for p in found if (p / "COMPLETE").exists())


def metrics(run_dir: Path) -> dict[int, dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines)}


def weights(checkpoint: Path, into: Path) -> dict[str, torch.Tensor]:
    """The model tensors of a DCP checkpoint (torch's own converter)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(checkpoint, into)
    return torch.load(into, weights_only=False)["train"]["model"]


def failure_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if "FAILED" in line]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, data_dir, preflight_record) -> tuple[Path, int, str]:
    run_dir = tmp_path_factory.mktemp("stop") / "run"
    rc, out = run(
        run_dir, data_dir, ["train.steps=4", "checkpoint.every=2"], nan_at="3:1", record=preflight_record
    )
    return run_dir, rc, out


@pytest.mark.heavy
def test_nan_on_one_rank_under_stop_ends_the_run_at_that_step(stopped):
    run_dir, rc, out = stopped
    assert rc == 1, out
    assert "Traceback" not in out, out
    lines = failure_lines(out)
    assert len(lines) == 1, out
    assert "diverged at step 3: action_loss is nan on rank 1 (latent_loss " in lines[0], out
    assert "grad_norm nan); the last finite checkpoint is checkpoint_step_2; fix: lower train.lr" in lines[0]
    result = summary(run_dir)
    assert result["status"] == "failed" and result["exit_code"] == 1, result
    diverged = result["diverged"]
    assert (diverged["step"], diverged["rank"], diverged["quantity"]) == (3, 1, "action_loss"), diverged
    assert diverged["last_finite_checkpoint"]["step"] == 2 and result["failed_rank"] == 1
    assert math.isfinite(diverged["values"]["latent_loss"])  # rank 1's latent loss, rank 0: untouched
    assert complete_steps(run_dir) == [2]  # no checkpoint from the diverged state
    assert max(metrics(run_dir)) == 3 and result["grad_norm_max"]["step"] in (1, 2)


@pytest.mark.heavy
def test_a_checkpoint_holding_nan_is_refused_in_the_preflight(stopped, data_dir, tmp_path):
    """An older version (or a hand) wrote a NaN into a checkpoint: the resume is refused, naming it."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp

    from trainer.checkpoint.layout import MARKER, file_sha256

    run_dir, _, _ = stopped
    source = run_dir / "checkpoints" / "checkpoint_step_2"
    bad = run_dir / "checkpoints" / "checkpoint_step_3"
    full = tmp_path / "full.pt"
    dcp_to_torch_save(source, full)
    state = torch.load(full, weights_only=False)
    name = sorted(state["train"]["model"])[0]
    state["train"]["model"][name].view(-1)[0] = float("nan")
    torch.save(state, full)
    torch_save_to_dcp(full, bad)
    for extra in source.iterdir():
        if extra.name.startswith("rng_rank") or extra.name == "train_state.json":
            shutil.copy(extra, bad / extra.name)
    saved = json.loads((bad / "train_state.json").read_text())
    (bad / "train_state.json").write_text(json.dumps({**saved, "step": 3}))
    files = {p.name: p.stat().st_size for p in bad.iterdir()}
    sha = {n: file_sha256(bad / n) for n in files}
    (bad / MARKER).write_text(json.dumps({"step": 3, "files": files, "sha256": sha}))  # no `finite`

    rc, out = run(run_dir, data_dir, ["train.steps=4", "checkpoint.every=2"])
    assert rc == 3, out
    assert f"cannot resume from {bad}: train.model.{name} (1 non-finite values, e.g. nan)" in out, out


@pytest.mark.heavy
def test_skip_drops_the_update_and_stops_after_too_many_in_a_row(tmp_path, data_dir, preflight_record):
    run_dir = tmp_path / "run"
    sets = ["train.steps=5", "checkpoint.every=1", "train.nonfinite=skip", "train.nonfinite_max_skips=1"]
    rc, out = run(run_dir, data_dir, sets, nan_at="2,4-5:0", record=preflight_record)
    assert rc == 1, out
    assert "WARNING: step 2: action_loss is nan on rank 0: optimizer step skipped" in out, out
    lines = failure_lines(out)
    assert len(lines) == 1 and "diverged at step 5 after 2 skipped step(s)" in lines[0], out
    assert "action_loss is nan on rank 0" in lines[0] and "checkpoint_step_4" in lines[0], out
    result = summary(run_dir)
    assert result["status"] == "failed" and result["nonfinite_skipped"] == [2, 4], result
    assert result["diverged"]["step"] == 5 and result["diverged"]["policy"] == "skip"
    assert math.isfinite(metrics(run_dir)[3]["action_loss"])  # the run went on after the skipped step
    assert complete_steps(run_dir) == [1, 2, 3, 4]
    one = weights(run_dir / "checkpoints" / "checkpoint_step_1", tmp_path / "1.pt")
    two = weights(run_dir / "checkpoints" / "checkpoint_step_2", tmp_path / "2.pt")
    three = weights(run_dir / "checkpoints" / "checkpoint_step_3", tmp_path / "3.pt")
    assert all(torch.equal(one[k], two[k]) for k in one)  # step 2 skipped: no update at all
    assert any(not torch.equal(two[k], three[k]) for k in two)  # step 3 trained


@pytest.mark.heavy
def test_a_learning_rate_that_diverges_on_its_own_stops_the_run(tmp_path, data_dir, preflight_record):
    run_dir = tmp_path / "run"
    sets = ["train.steps=8", "checkpoint.every=1", "train.lr=1e10"]
    rc, out = run(run_dir, data_dir, sets, record=preflight_record, nproc=1)  # every rank diverges
    assert rc == 1, out
    lines = failure_lines(out)
    assert len(lines) == 1 and "diverged at step" in lines[0], out
    diverged = summary(run_dir)["diverged"]
    assert diverged["quantity"] in ("latent_loss", "action_loss", "grad_norm"), diverged
    assert complete_steps(run_dir) == list(range(1, diverged["step"]))  # every one finite, none after


# --- in-process -------------------------------------------------------------------------------------


@pytest.mark.fast
def test_blame_names_the_first_rank_whose_own_value_is_nonfinite():
    losses = {"loss": math.nan, "latent_loss": 2.1, "action_loss": math.nan}
    # slots per rank: (latent, action); rank 0 finite, rank 1 action nan, rank 2 latent inf
    found = blame(7, [0, 0, 0, 1, 1, 0], losses, math.inf)
    assert (found.step, found.rank, found.quantity, found.value) == (7, 1, "action_loss", "nan")
    assert blame(7, [0] * 4, {"latent_loss": 1.0, "action_loss": 2.0}, 3.0) is None
    by_norm = blame(8, [0] * 4, {"latent_loss": 1.0, "action_loss": 2.0}, math.inf)
    assert (by_norm.rank, by_norm.quantity, by_norm.value) == (None, "grad_norm", "inf")
    assert "on every rank" in by_norm.line()


@pytest.mark.fast
def test_skip_policy_counts_skips_in_a_row_then_stops():
    found = Diverged(1, "grad_norm", "nan", None, {})
    policy = NonfinitePolicy("skip", 2)
    assert [policy.decide(found), policy.decide(None), policy.decide(found), policy.decide(found)] == [
        SKIP, APPLY, SKIP, SKIP,
    ]  # fmt: skip
    assert policy.decide(found) == STOP and found.skipped == 3
    assert NonfinitePolicy("stop", 3).decide(found) == STOP


@pytest.mark.fast
def test_spike_watch_keeps_the_largest_and_warns_on_a_spike():
    watch = SpikeWatch(factor=10.0, window=10, warmup=3)
    assert [watch.observe(s, v) for s, v in enumerate([1.0, 1.2, 0.9, 1.1], 1)] == [None] * 4
    warning = watch.observe(5, 50.0)
    assert warning is not None and warning.startswith("WARNING: step 5: grad_norm 50")
    assert watch.observe(6, math.nan) is None and watch.peak() == {"value": 50.0, "step": 5}
