"""A failure inside the ranks before the first step ends bin/train with one line on the terminal and no
Python traceback there (a rank's nor torchrun's ChildFailedError); the tracebacks stay in the attempt's
files, and the line says the next run fails the same way until the input is fixed.

Runs bin/train itself (the bash entry point, the launcher, torchrun, one gloo rank) on a tiny model (the
filtering of a two-rank torchrun transcript: tests/test_failure_lines.py, on a recorded one). The
run dir is seeded with the session's recorded compile-check pass (tests/support/runs.py: seed_preflight),
so the preflight skips its compiles: the claim is about the ranks. The compile checks themselves run in
conftest's `preflight_record` (a real `--preflight-only`) and tests/test_slurm.py's `requeue` scenario.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.runs import clean_env, seed_preflight

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "model.dim=48", "model.heads=2", "model.depth=2", "model.latent_size=8", "model.attn_block=16",
    "data.frames=4", "train.grad_accum=1", "train.steps=2", "train.warmup_steps=1", "checkpoint.every=2",
]  # fmt: skip


@pytest.mark.heavy
def test_an_unreadable_episode_fails_in_one_line_with_the_traceback_kept(tmp_path, preflight_record):
    data = tmp_path / "episodes"
    data.mkdir()
    (data / "0.pkl").write_bytes(b"not a pickle")  # found by the preflight, unreadable to the ranks
    env = clean_env(tmp_path / "no-envs")  # no provisioned env: the tool env
    run_dir = tmp_path / "run"
    seed_preflight(run_dir, preflight_record)  # the session's compile-check pass: not a preflight test
    sets = [a for item in [*TINY, f"data.path={data}"] for a in ("--set", item)]
    out = subprocess.run(
        [str(REPO / "bin" / "train"), "furniture_train", "1", "--run-dir", str(run_dir), *sets],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "ChildFailedError" not in out.stderr, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("[bin/train] FAILED: rank ") and "DatasetError: " in last and "0.pkl" in last
    assert last.endswith(f"the next run fails the same way until the data is fixed; then it starts fresh "
                         f"(no complete checkpoint in {run_dir / 'checkpoints'})")  # fmt: skip
    (attempt,) = (run_dir / "attempts").iterdir()
    assert "Traceback" in (attempt / "node0.log").read_text()  # torchrun's, kept for the curious
    failed = [json.loads(p.read_text()) for p in attempt.glob("rank_*.json")]
    assert any(r["status"] == "failed" and r["needs_fix"] == "the data is fixed" for r in failed)
    assert any("Traceback" in p.read_text() for p in attempt.glob("rank_*.log"))
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
