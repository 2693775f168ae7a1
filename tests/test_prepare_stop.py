"""A stop while bin/train prepares the latent cache on first use (2 CPU ranks, a tiny model): rank 0 asks
its stop request between episodes, every rank learns it at the cache's agreement, and the attempt ends as
a stop (exit 75, summary `preempted`, Slurm requeues after USR1), never a failure, with the episodes
encoded so far kept; the next run's preparation continues from them (the kept entry is not written
again) and trains. It was acted on only after the whole preparation (hours at full scale: past Slurm's
warning lead, so the job was killed at its time limit and not requeued).

Synchronisation is by files: LINGBOT_TEST_PAUSE_AT=prepare:1 parks rank 0 after its first encoded
episode; the test signals the launcher, waits for the launcher's stop file, then releases the rank.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.support import runs

pytestmark = [pytest.mark.heavy]


def entries(data: Path) -> dict[Path, tuple[int, int]]:
    """The cache's episode entries: {path: (inode, mtime_ns)}."""
    found = [p for p in data.rglob("*.npz") if ".latents" in p.parts and p.name != "text.npz"]
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in found}


def test_a_stop_while_the_cache_is_prepared_is_a_stop_and_the_next_run_continues_it(
    tmp_path, preflight_record
):
    env = runs.clean_env(tmp_path / "no-envs")
    run_dir, data, pause = tmp_path / "run", tmp_path / "data" / "furniture", tmp_path / "pause"
    runs.seed_preflight(run_dir, preflight_record)
    overrides = runs.tiny(steps=2)  # 4 generated episodes, prepared by rank 0 while rank 1 waits for it
    proc = runs.launch(run_dir, data, env, overrides=overrides, extra_env=runs.pause_env(pause, "prepare:1"))
    runs.wait_for(pause, "reached", proc)
    proc.send_signal(signal.SIGUSR1)  # Slurm's warning, as the batch script forwards it
    runs.wait_for(run_dir, "attempts/*/stop", proc)
    runs.release(pause)
    rc, out, _ = runs.finish(proc)
    assert rc == 75, out
    assert "Traceback" not in out, out
    s = runs.summary(run_dir)
    assert (s["status"], s["exit_code"], s["last_step"], s["last_complete_checkpoint"]) == (
        "preempted",
        75,
        None,
        None,
    ), s
    assert s["reason"].startswith(
        "stopped while preparing the latent cache (the launcher received SIGUSR1): 1 of 4 episode(s) of "
    ), s
    assert "the next attempt's preparation continues from them" in s["reason"]
    assert f"preempted ({s['reason']}), exit 75: run the same command again" in out, out
    kept = entries(data)
    assert len(kept) == 1, kept  # the one encoded before the stop, whole
    assert not list(data.rglob("manifest.json"))  # the cache is not complete: never taken for one

    rc, out, _ = runs.finish(runs.launch(run_dir, data, env, overrides=overrides, nproc=1))
    assert rc == 0, out
    s = runs.summary(run_dir)
    assert (s["status"], s["last_step"]) == ("completed", 2), s
    after = entries(data)
    assert len(after) == 4 and all(after[p] == stamp for p, stamp in kept.items()), (kept, after)
    assert out.count("prepare[rank 0]: ") == 3, out  # only the three missing episodes were encoded
    assert len(list(data.rglob("manifest.json"))) == 1
