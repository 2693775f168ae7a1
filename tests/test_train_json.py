"""bin/train --json / --json-file: exactly one JSON object on stdout (all text on stderr, the ranks'
included), the same exit status as without it, and a JSON error for a bad command line.

Every case runs bin/train itself (the bash entry point, then the launcher, then torchrun and its ranks).
The run's case has one rank: a rank's stdout reaches stderr through torchrun's redirect, the same for
every rank, so a second rank would add only launch cost.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.runs import REPO, clean_env, seed_preflight, set_args, tiny

TINY = tiny(steps=2, grad_accum=1, keep=None, tensorboard=None)


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return clean_env(tmp_path / "no-envs")  # no provisioned env: the tool env, said loudly


def bin_train(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / "bin" / "train"), *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=400
    )


def the_object(stdout: str) -> dict:
    """stdout must be one JSON object and nothing else."""
    obj = json.loads(stdout)  # raises on any stray byte before or after it
    assert isinstance(obj, dict)
    return obj


@pytest.mark.heavy
@pytest.mark.slow
def test_a_run_prints_only_its_outcome_on_stdout(tmp_path, env, preflight_record):
    run_dir, data = tmp_path / "run", tmp_path / "episodes"
    seed_preflight(run_dir, preflight_record)
    sets = set_args([*TINY, f"data.path={data}"])
    json_file = tmp_path / "out" / "outcome.json"
    json_file.parent.mkdir()
    out = bin_train(env, "furniture_train", "1", "--run-dir", str(run_dir), *sets, "--json",
                    "--json-file", str(json_file))  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    obj = the_object(out.stdout)
    assert obj["ok"] is True and obj["exit_code"] == 0 and obj["status"] == "completed"
    assert obj["last_step"] == 2 and set(obj["final_losses"]) >= {"latent_loss", "action_loss"}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {k: obj[k] for k in summary} == summary  # the object is summary.json plus ok/exit_code
    assert json.loads(json_file.read_text()) == obj
    assert "[train] step 2/2 " in out.stderr  # the ranks' lines went to stderr

    # a re-run of the finished run: still one object, the settled summary, exit 0
    again = bin_train(env, "furniture_train", "1", "--run-dir", str(run_dir), *sets, "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    assert the_object(again.stdout)["status"] == "completed"


@pytest.mark.heavy
def test_usage_and_config_errors_are_json_with_exit_2(tmp_path, env):
    bad_nproc = bin_train(env, "furniture_train", "0", "--json")
    assert bad_nproc.returncode == 2
    obj = the_object(bad_nproc.stdout)
    assert obj == {"ok": False, "exit_code": 2, "error": obj["error"]} and "at least 1" in obj["error"]
    assert "usage: bin/train" in bad_nproc.stderr

    bad_set = bin_train(env, "furniture_train", "2", "--run-dir", str(tmp_path / "r"), "--set",
                        "train.no_such=1", "--json")  # fmt: skip
    assert bad_set.returncode == 2 and "no_such" in the_object(bad_set.stdout)["error"]
    assert not (tmp_path / "r").exists()  # nothing written

    # the file form also reports a usage error; stdout then keeps its usual (empty) content
    target = tmp_path / "err.json"
    with_file = bin_train(env, "no_such_config", "2", "--json-file", str(target))
    assert with_file.returncode == 2 and with_file.stdout == ""
    assert json.loads(target.read_text())["ok"] is False


@pytest.mark.heavy
def test_preflight_failure_is_the_summary_with_exit_3(tmp_path, env):
    run_dir = tmp_path / "run"
    out = bin_train(env, "furniture_train", "2", "--run-dir", str(run_dir), "--env", "nope", "--json")
    assert out.returncode == 3, out.stderr[-2000:]
    obj = the_object(out.stdout)
    assert obj["ok"] is False and obj["exit_code"] == 3 and obj["status"] == "preflight_failed"
    assert "nope" in obj["reason"]


@pytest.mark.heavy
def test_sbatch_to_stdout_travels_inside_the_object(tmp_path, env):
    # a run dir of its own: a job script makes its run dir (Slurm opens the job's output there), and the
    # default one is in the checkout (runs/furniture_train), where a test leaves nothing
    run_dir = ["--run-dir", str(tmp_path / "run")]
    out = bin_train(env, "furniture_train", "2", *run_dir, "--sbatch", "--cpu-scale", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    obj = the_object(out.stdout)
    assert obj["ok"] is True and obj["script"].startswith("#!") and "#SBATCH" in obj["script"]
    assert (tmp_path / "run").is_dir()
    path = tmp_path / "job.sbatch"
    written = bin_train(env, "furniture_train", "2", *run_dir, "--sbatch", str(path), "--cpu-scale", "--json")
    assert written.returncode == 0 and the_object(written.stdout)["sbatch"] == str(path) and path.is_file()
