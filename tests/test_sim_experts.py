"""The scripted LIBERO experts through bin/evaluate (`--sim libero --expert`): what is refused (fast), and
one real episode scored by the same workers, counting and report as a checkpoint's (heavy: one scene
built, 94 steps with both cameras rendered; measured 220 s on a shared 2-core node at load ~10, its record's
own parts 175 s there: build 28, reset 29, render 101, physics 14, expert 1). The experts' success
rates over the 50 official init states are measured by `python -m trainer.sim.experts`
(bench/results/*-libero-experts.md), not here: too slow for the suite."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support import runs
from trainer.evaluation.sim.command import Options, run_libero
from trainer.sim import experts, suites

EVALUATE = runs.REPO / "bin" / "evaluate"
DRAWER = 0  # libero_goal "open the middle drawer of the cabinet"


@pytest.mark.fast
@pytest.mark.parametrize(
    ("target", "suite", "tasks", "line"),
    [
        ("runs/x", "libero_goal", "0", "--expert plays the scripted experts, not runs/x: leave TARGET out"),
        (
            None,
            "libero_goal",
            "0,2",
            "no scripted expert for libero_goal task(s) 2; tasks with experts in "
            "libero_goal: 0 (open the middle drawer of the cabinet)",
        ),  # fmt: skip
        (None, "libero_10", None, "no scripted expert for libero_10; tasks with experts in libero_10: none"),
    ],
)
def test_expert_mode_refuses_a_target_and_tasks_without_an_expert(tmp_path, target, suite, tasks, line):
    opts = Options(suite=suite, tasks=tasks, episodes=1, out=str(tmp_path / "out"), expert=True)
    with pytest.raises(suites.UsageError) as exc:
        run_libero(target, opts, print)
    assert line in str(exc.value)
    assert not (tmp_path / "out").exists()  # refused before anything is written


@pytest.mark.fast
def test_the_expert_registry_names_its_tasks():
    assert DRAWER in experts.tasks_with_experts("libero_goal")
    assert experts.tasks_with_experts("libero_10") == []
    with pytest.raises(experts.ExpertError, match="no scripted expert for libero_goal task.s. 2; tasks with"):
        experts.expert_for("libero_goal", 2)
    assert experts.task_language("libero_goal", DRAWER) == "open the middle drawer of the cabinet"


@pytest.mark.heavy
def test_the_drawer_expert_succeeds_through_the_evaluations_workers(tmp_path):
    out = tmp_path / "experts"
    argv = [str(EVALUATE), "--sim", "libero", "--expert", "--suite", "libero_goal", "--tasks", str(DRAWER),
            "--episodes", "1", "--out", str(out), "--json"]  # fmt: skip
    env = runs.clean_env(tmp_path / "no-envs")
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, cwd=runs.REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert (result["checkpoint"], result["episodes"], result["successes"]) == ("expert", 1, 1)
    assert json.loads((out / "results.json").read_text())["successes"] == 1
    record = json.loads((out / "episodes" / "t00_e000.json").read_text())
    assert record["success"] and 0 < record["steps"] < 800
    video = out / record["video"]
    assert video.name == "t00_e000_success.mp4" and video.stat().st_size > 1000
    assert (out / "success.png").is_file()


@pytest.mark.fast
def test_bin_evaluate_expert_refusal_exits_2(tmp_path):
    env = runs.clean_env(tmp_path / "no-envs")
    base = [
        str(EVALUATE),
        "--sim",
        "libero",
        "--expert",
        "--suite",
        "libero_goal",
        "--out",
        str(tmp_path / "o"),
    ]
    proc = subprocess.run([*base, "--tasks", "2"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "tasks with experts in libero_goal: 0 (open the middle" in proc.stderr
