"""Full disks and quotas on real small filesystems (tmpfs mounted and unmounted by the test, as root).

Each case runs `python -m trainer.launcher` (what bin/train execs) on CPU ranks with a tiny model and the
run dir on a tmpfs, and asserts the one-line message, the exit code, a summary.json that does not claim
success, no traceback on the terminal, and that a re-run after freeing space completes (resuming where
there is a checkpoint). Where mounting is not allowed the tests skip with the reason (they never pass
without running).

Ranks: 2 where a second rank is part of the path (a DCP save on 2 ranks, and rank 1 waiting in a collective
while rank 0 prepares the cache); the final summary's case runs 1 rank for 2 steps, as rank 0 alone writes
summary.json (after the last barrier) and the launcher judges the run. The latent cache's case makes its
episodes in this process with data.latent_cache=false (build_stream of rank 1 of 2: a private temporary
cache, no collective, nothing beside the episodes), so its re-run starts fresh; that a run may resume
across a change of data.latent_cache (a free key) is
tests/test_checkpoint.py::test_resume_conflicts_name_what_changed's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.diskfull import (
    Tmpfs,
    assert_said_once,
    launch,
    launcher_lines,
    one_checkpoint,
    tiny_config,
)
from tests.support.runs import STEPS, clean_env, finish, release, seed_preflight, summary, tiny, wait_for
from trainer.checkpoint.layout import damage, scan

pytestmark = [pytest.mark.heavy, pytest.mark.slow]


@pytest.fixture
def tmpfs(tmp_path) -> Iterator:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted: list[Tmpfs] = []

    def make(size: int, name: str = "fs") -> Tmpfs:
        fs = Tmpfs(tmp_path / name, size)
        mounted.append(fs)
        return fs

    yield make
    for fs in mounted:
        fs.umount()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("episodes") / "furniture"


@pytest.fixture(scope="module")
def base_env(tmp_path_factory) -> dict[str, str]:
    return clean_env(tmp_path_factory.mktemp("no-envs"))


def test_preflight_refuses_a_run_dir_that_cannot_hold_keep_plus_one(
    tmp_path, tmpfs, data_dir, base_env, preflight_record
):
    one = one_checkpoint()
    fs = tmpfs(int(one * 2.5))  # keep 2 + 1 = 3 checkpoints do not fit
    run_dir = fs.path / "run"
    seed_preflight(run_dir, preflight_record)
    rc, out, err = finish(launch(run_dir, data_dir, base_env))
    assert rc == 3, err
    (line,) = launcher_lines(err, "cannot hold checkpoint.keep + 1 = 3 checkpoints")
    assert "needs" in line and "free" in line and "skip_space_check" in line
    assert summary(run_dir)["status"] == "preflight_failed" and not (run_dir / "checkpoints").exists()
    assert "Traceback" not in err


def test_out_of_space_during_a_save_is_one_line_and_a_rerun_resumes(
    tmp_path, tmpfs, data_dir, base_env, preflight_record
):
    one = one_checkpoint()
    fs = tmpfs(int(one * 1.6))  # one checkpoint fits, the second save runs out of space
    run_dir = fs.path / "run"
    seed_preflight(run_dir, preflight_record)
    rc, out, err = finish(launch(run_dir, data_dir, base_env, "checkpoint.skip_space_check=true"))
    assert rc == 1, err
    assert launcher_lines(err, "WARNING:") and launcher_lines(err, "skip_space_check=true: running anyway")
    line = assert_said_once(err, fs)
    assert "during the checkpoint save of" in line
    s = summary(run_dir)
    assert s["status"] == "failed" and s["exit_code"] == 1 and s["out_of_space"]["what"] == "checkpoint save"
    root = run_dir / "checkpoints"
    assert not [p for p in root.iterdir() if ".tmp-" in p.name]  # the partial one is gone at once
    complete, _ = scan(root)
    assert [c.step for c in complete] == [2] and damage(complete[0].path, 2, checksums=True) is None

    fs.resize(one * 8)  # free space: the re-run resumes from step 2 and completes
    rc, out, err = finish(launch(run_dir, data_dir, base_env))
    assert rc == 0, err
    s = summary(run_dir)
    assert (s["status"], s["resumed_from"], s["last_step"]) == ("completed", 2, STEPS)


def test_out_of_space_writing_the_final_summary_never_claims_success(
    tmp_path, tmpfs, data_dir, base_env, preflight_record
):
    one = one_checkpoint()
    fs = tmpfs(one * 8)
    run_dir = fs.path / "run"
    seed_preflight(run_dir, preflight_record)
    pause = tmp_path / "pause"
    pause.mkdir()
    short = {"overrides": tiny(steps=2, keep=2, tensorboard=False), "nproc": 1}  # rank 0 alone writes it
    extra = {"LINGBOT_TEST_PAUSE_AT": "summary:2", "LINGBOT_TEST_PAUSE_DIR": str(pause)}
    proc = launch(run_dir, data_dir, base_env, extra_env=extra, **short)
    wait_for(pause, "reached", proc)
    filler = fs.fill()  # the disk fills up while rank 0 is about to write summary.json
    release(pause)
    rc, out, err = finish(proc)
    assert rc == 1, err
    line = assert_said_once(err, fs)
    assert "during the summary write of" in line
    assert launcher_lines(err, "could not write the summary")  # said on stderr, as it is not on disk
    s = summary(run_dir)
    assert s["status"] == "running" and s["exit_code"] is None  # this attempt's `running`: not done

    filler.unlink()  # free space: the re-run finds the last step saved and says the run is complete
    rc, out, err = finish(launch(run_dir, data_dir, base_env, **short))
    assert rc == 0, err
    assert summary(run_dir)["status"] == "completed"


def test_out_of_space_in_the_latent_cache(tmp_path, tmpfs, base_env, preflight_record):
    from trainer.config import apply_overrides
    from trainer.data.stream import build_stream

    fs = tmpfs(64 << 20, "data")  # the collector-format episodes (two 224 px views) fit, then it is filled
    data = fs.path / "furniture"
    run_fs = tmpfs(one_checkpoint() * 8, "runfs")
    run_dir = run_fs.path / "run"
    seed_preflight(run_dir, preflight_record)
    # generate the episodes without a cache beside them (latent_cache=false: a private temporary one, made by
    # rank 1 of 2 alone: no process group here, so no collective either)
    cfg = tiny_config()
    apply_overrides(cfg, {"data.path": str(data), "data.latent_cache": "false"}, "test")
    assert build_stream(cfg, 1, 2).data_summary is not None
    latents = data / "one_leg" / ".latents"
    assert not latents.exists()
    filler = fs.fill()  # the episodes fit; the cache beside them does not
    rc, out, err = finish(launch(run_dir, data, base_env, "train.steps=2"))
    assert rc == 1, err
    line = assert_said_once(err, fs, data=True)
    assert f"during the latent cache of {latents}/" in line and ".npz: 0 B free" in line
    s = summary(run_dir)
    assert (s["status"], s["exit_code"], s["out_of_space"]["what"]) == ("failed", 1, "latent cache")
    # nothing half-written: no manifest (the completion marker), no temporary file, no partial entry
    written = [p for p in latents.rglob("*") if p.is_file()]
    assert not [p for p in written if p.name == "manifest.json" or p.name.endswith(".tmp")], written
    filler.unlink()  # free space: the re-run prepares the cache and completes (one rank: no checkpoint yet)
    rc, out, err = finish(launch(run_dir, data, base_env, "train.steps=2", nproc=1))
    assert rc == 0, err
    s = summary(run_dir)
    assert (s["status"], s["resumed_from"], s["last_step"]) == ("completed", None, 2)
    assert len(list(latents.glob("*/manifest.json"))) == 1
