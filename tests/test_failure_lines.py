"""The last line of every bin/train outcome says what the next run will do (resume from step N, start
fresh, find the run complete, or fail the same way until the named fix), and the terminal never shows a
Python traceback (torchrun's stderr is filtered; every line is kept in the attempt's node<N>.log).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.config import load_config
from trainer.launcher.console import TracebackFilter
from trainer.launcher.summaries import next_run_line

pytestmark = pytest.mark.fast

# What a failing 2-rank attempt printed through torchrun before the ranks recorded their failures quietly
# (torch 2.13: a rank's uncaught exception, then torchrun's own ChildFailedError and its banner).
TORCHRUN_STDERR = """\
[train] rank 0: building the model
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/repo/trainer/loop/train.py", line 120, in build
    stream = build_stream(cfg, rank, world_size)
trainer.data.formats.furniturebench.DatasetError: /data/0.pkl: <file>: not a readable episode pickle

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/repo/trainer/loop/train.py", line 330, in main
ValueError: chained
[rank1]: Traceback (most recent call last):
[rank1]:   File "/repo/trainer/loop/train.py", line 88, in build
[rank1]: ValueError: Invalid learning rate: -1.0
W1203 19:00:00.000000 123 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 7 closing signal SIGTERM
E1203 19:00:00.000000 123 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 0 (pid: 6) of binary: /venv/bin/python
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 927, in main
    run(args)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
trainer.loop.train FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_19:00:00
  rank      : 0 (local_rank: 0)
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
[train] a line after it all
"""  # noqa: E501, W291


def test_the_filter_keeps_everything_but_tracebacks():
    f = TracebackFilter()
    kept = [line for line in TORCHRUN_STDERR.splitlines(keepends=True) if f.keep(line)]
    assert "".join(kept).splitlines() == [
        "[train] rank 0: building the model",
        "W1203 19:00:00.000000 123 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 7 "
        "closing signal SIGTERM",
        "E1203 19:00:00.000000 123 torch/distributed/elastic/multiprocessing/api.py:874] failed "
        "(exitcode: 1) local_rank: 0 (pid: 6) of binary: /venv/bin/python",
        "[train] a line after it all",
    ]


def checkpoint(run_dir: Path, step: int) -> None:
    path = run_dir / "checkpoints" / f"checkpoint_step_{step}"
    path.mkdir(parents=True)
    (path / "train_state.json").write_text(json.dumps({"step": step, "world_size": 2, "config": {}}))
    files = {p.name: p.stat().st_size for p in path.iterdir()}
    (path / "COMPLETE").write_text(json.dumps({"step": step, "files": files}))


def test_next_run_line_names_what_the_next_run_does(tmp_path):
    cfg = load_config("furniture_train", cpu_scale=True)  # 40 steps
    run_dir = tmp_path / "run"
    assert next_run_line(run_dir, cfg).startswith("the next run starts fresh (no complete checkpoint in ")
    checkpoint(run_dir, 10)
    assert next_run_line(run_dir, cfg).startswith("the next run resumes from step 10 (")
    assert next_run_line(run_dir, cfg, "the data is fixed").startswith(
        "the next run fails the same way until the data is fixed; then it resumes from step 10 ("
    )
    checkpoint(run_dir, 40)
    assert "finds the run complete" in next_run_line(run_dir, cfg) and "step 40" in next_run_line(
        run_dir, cfg
    )
    assert next_run_line(None, None) == "nothing was written; the next run starts fresh"
