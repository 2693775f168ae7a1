"""bin/train's launcher without starting ranks: usage and preflight errors, env choice and variables,
node-local compile caches, Slurm rendezvous, the verdict from rank records, requeue, --sbatch.

`trainer.launcher.main.main` runs in this process; where a test needs to get past preflight, torchrun is
replaced by a recorder (the real torchrun path is covered in test_resume.py).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import provision.check
import provision.nodeinfo
from provision.check import FAIL, PASS, Check, Report
from provision.paths import repo_root
from trainer.attempt import COMPLETED, PREEMPTED, Attempt, Summary, write_summary
from trainer.config import load_config
from trainer.launcher import main as launch
from trainer.launcher import supervise
from trainer.launcher.cli import parse_args
from trainer.launcher.envchoice import EnvChoice, resolve_env, tool_env
from trainer.launcher.errors import PreflightError
from trainer.launcher.preflight import env_checks
from trainer.launcher.rendezvous import rendezvous
from trainer.launcher.supervise import requeue
from trainer.launcher.verdict import torchrun_error_files
from trainer.launcher.verdict import verdict as attempt_verdict

pytestmark = pytest.mark.fast

TINY = ["--set", "train.steps=4"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for var in list(os.environ):
        if var.startswith(("SLURM_", "LINGBOT_")) or var in ("CONDA_PREFIX", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(var)
    monkeypatch.setenv("CONDA_ENVS_PATH", str(tmp_path / "envs"))
    monkeypatch.setattr(launch, "gpu_count", lambda: 0)


def verdict(world_size, nproc, attempt_dir, run_dir, attempt_id, rc, tail):
    assert Path(attempt_dir).name == attempt_id
    return attempt_verdict(world_size, nproc, Attempt(attempt_dir), run_dir, rc, tail)


class FakeTorchrun:
    """Stands in for supervise.Torchrun: records what would run; every rank 'vanishes' (no records)."""

    calls: list = []

    def __init__(self, command, env, attempt, detector=None, log=None):
        FakeTorchrun.calls.append((command, env, attempt.dir))
        # what summary.json says while the ranks would be starting
        FakeTorchrun.summary_at_start = json.loads((attempt.dir.parent.parent / "summary.json").read_text())
        self.signals, self.stderr_tail, self.record_lines, self.killed_note = [], [], {}, None
        self.stopped_before_ranks = self.hung = None

    def wait(self):
        return 0


@pytest.fixture
def fake_torchrun(monkeypatch):
    FakeTorchrun.calls = []
    monkeypatch.setattr(supervise, "Torchrun", FakeTorchrun)
    return FakeTorchrun


def report(*checks: Check) -> Report:
    return Report(
        prefix="p", env_name="e", worker=False, fast=True, node="n", started="now", checks=list(checks)
    )


@pytest.fixture
def passing_checks(monkeypatch):
    monkeypatch.setattr(
        provision.check, "run_checks", lambda prefix, **kw: report(Check("x", PASS, 0.0, "ok"))
    )


def make_prefix(path: Path, variables: str = "") -> Path:
    """A prefix that provision.prefix.completeness accepts, with an env-vars file."""
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").symlink_to(sys.executable)
    (path / "conda-meta").mkdir()
    manifest = {"format": 1, "complete": True, "generation": os.path.realpath(path), "files": []}
    (path / "conda-meta" / "lingbot-provision.json").write_text(json.dumps(manifest))
    (path / "etc" / "lingbot").mkdir(parents=True)
    (path / "etc" / "lingbot" / "env-vars").write_text(variables)
    return path


def fake_checkpoint(run_dir: Path, step: int, config: dict, world_size: int = 2) -> Path:
    path = run_dir / "checkpoints" / f"checkpoint_step_{step}"
    path.mkdir(parents=True)
    (path / "train_state.json").write_text(
        json.dumps({"step": step, "world_size": world_size, "config": config})
    )
    files = {p.name: p.stat().st_size for p in path.iterdir()}
    (path / "COMPLETE").write_text(json.dumps({"step": step, "files": files}))
    return path


def nothing_written(run_dir: Path) -> bool:
    return not (run_dir / "checkpoints").exists() and not (run_dir / "attempts").exists()


# --- usage and preflight errors ---------------------------------------------------------------------


def test_unknown_config_is_a_usage_error_and_writes_nothing(tmp_path, capsys):
    assert launch.main(["nope", "2", "--run-dir", str(tmp_path / "run")]) == 2
    assert "unknown config 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "item, message",
    [
        ("train.stepz=3", "unknown key 'train.stepz'"),
        ("train.steps=many", "bad value 'many'"),
        ("steps", "key=value"),
    ],
)
def test_bad_set_is_a_usage_error_and_writes_nothing(tmp_path, capsys, item, message):
    assert launch.main(["furniture_train", "2", "--run-dir", str(tmp_path / "run"), "--set", item]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--run-dir", ""], "argument --run-dir: is empty"),  # was: the run trained in the working dir
        (["--master-port", "99999"], "is not a TCP port"),  # was: torchrun's hidden ValueError, exit 1
        (["--sbatch", "-", "--time", "abc"], "is not a Slurm time"),  # was: #SBATCH --time=abc
        (["--sbatch", "-", "--gpus-per-node", "-3"], "must be 0 or more"),
    ],
)
def test_a_bad_option_value_is_a_usage_error_and_writes_nothing(
    tmp_path, capsys, monkeypatch, flags, message
):
    monkeypatch.chdir(tmp_path)
    assert launch.main(["furniture_train", "2", *flags]) == 2
    assert message in capsys.readouterr().err
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["MASTER_PORT", "SLURM_NODEID", "SLURM_NNODES", "SLURM_RESTART_COUNT"])
def test_a_malformed_environment_number_is_a_usage_error_naming_it(tmp_path, capsys, monkeypatch, name):
    """Found by a review: `MASTER_PORT=29500x` was int()'s traceback, exit 1 ("a rank failed"), no summary."""
    monkeypatch.setenv(name, "29500x")
    assert launch.main(["furniture_train", "2", "--run-dir", str(tmp_path / "run"), *TINY]) == 2
    assert f"the environment's {name}='29500x' is not a whole number" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    # a launch that does not read it is not refused for it (a review): --sbatch, or the option replacing it
    assert launch.main(["furniture_train", "2", "--run-dir", str(tmp_path / "sb"), "--sbatch"]) == 0
    replaced_by = {"MASTER_PORT": "--master-port", "SLURM_NODEID": "--node-rank", "SLURM_NNODES": "--nnodes"}
    if name in replaced_by:
        from trainer.launcher.rendezvous import bad_int_variable

        given = parse_args(["furniture_train", "2", replaced_by[name], "1"])
        assert bad_int_variable({name: "29500x"}, given) is None


def test_a_tilde_in_the_run_dir_is_the_home_folder(tmp_path, monkeypatch):
    """`--run-dir=~/x` reaches us unexpanded (the shell expands only a word's leading ~): it made a folder
    named `~` in the working directory (found by a review; an `rm -rf ~` waiting to happen)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert parse_args(["furniture_train", "1", "--run-dir=~/x"]).run_dir == tmp_path / "home" / "x"


def test_unwritable_run_dir_fails_preflight_and_writes_nothing(tmp_path, capsys, fake_torchrun):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert launch.main(["furniture_train", "2", "--run-dir", str(blocker / "run"), *TINY]) == 3
    assert "is not writable" in capsys.readouterr().err
    assert blocker.read_text() == "" and not fake_torchrun.calls


@pytest.mark.parametrize("how", [["--env", "nope"], ["--prefix", "{tmp}/half-env"]])
def test_missing_or_incomplete_env_fails_preflight(tmp_path, capsys, fake_torchrun, how):
    (tmp_path / "half-env" / "bin").mkdir(parents=True)  # exists, but provision never finished
    run_dir = tmp_path / "run"
    argv = ["furniture_train", "2", "--run-dir", str(run_dir), *TINY, *(a.format(tmp=tmp_path) for a in how)]
    assert launch.main(argv) == 3
    err = capsys.readouterr().err
    assert "is not usable" in err and "bin/provision" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "preflight_failed" and summary["exit_code"] == 3
    assert "is not usable" in summary["reason"]
    assert nothing_written(run_dir) and not fake_torchrun.calls


def test_failed_preflight_keeps_the_last_real_run_in_the_summary(tmp_path, capsys, fake_torchrun):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    preempted = Summary(PREEMPTED, steps_requested=40, last_step=12, final_losses={"loss": 1.5})
    write_summary(run_dir, preempted)
    argv = ["furniture_train", "2", "--run-dir", str(run_dir), *TINY, "--env", "nope"]
    for _ in range(2):  # a second failure does not bury the preempted run under the first failure
        assert launch.main(argv) == 3
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "preflight_failed" and summary["previous_status"] == "preempted"
        assert summary["previous"]["last_step"] == 12 and summary["previous"]["final_losses"] == {"loss": 1.5}
    assert not fake_torchrun.calls


def test_failed_env_check_stops_before_any_rank_with_its_message_and_fix(
    tmp_path, capsys, monkeypatch, fake_torchrun
):
    failing = Check(
        "compile.triton_build",
        FAIL,
        0.1,
        "RuntimeError: Failed to find C compiler",
        "provision the env: bin/provision",
    )
    monkeypatch.setattr(provision.check, "run_checks", lambda prefix, **kw: report(failing))
    run_dir = tmp_path / "run"
    prefix = make_prefix(tmp_path / "env")
    assert (
        launch.main(["furniture_train", "2", "--run-dir", str(run_dir), "--prefix", str(prefix), *TINY]) == 3
    )
    err = capsys.readouterr().err
    assert "compile.triton_build: RuntimeError: Failed to find C compiler" in err
    assert "fix: provision the env: bin/provision" in err
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "preflight_failed"
    assert nothing_written(run_dir) and not fake_torchrun.calls


def test_incompatible_checkpoint_fails_preflight(tmp_path, capsys, passing_checks, fake_torchrun):
    run_dir = tmp_path / "run"
    saved = load_config("furniture_train", cpu_scale=True).to_dict()
    saved["model"]["depth"] += 1
    fake_checkpoint(run_dir, 2, saved)
    assert launch.main(["furniture_train", "2", "--run-dir", str(run_dir), *TINY]) == 3
    assert "cannot resume from" in capsys.readouterr().err
    assert not fake_torchrun.calls


def test_finished_run_says_so_and_trains_nothing(tmp_path, capsys, fake_torchrun):
    run_dir = tmp_path / "run"
    fake_checkpoint(run_dir, 4, load_config("furniture_train", cpu_scale=True).to_dict())
    assert launch.main(["furniture_train", "2", "--run-dir", str(run_dir), *TINY]) == 0
    err = capsys.readouterr().err
    assert "run complete" in err
    assert "its COMPLETE lists no sha256 (an older or hand-made marker)" in err  # size-only checks, said
    assert not fake_torchrun.calls


def test_a_finished_run_of_other_settings_is_refused_not_called_complete(tmp_path, capsys, fake_torchrun):
    """Found by a review: a rerun with another depth or seed (or rank count) on a finished run said "run
    complete" and exited 0; with steps left the same mismatch was refused. Now both are."""
    run_dir = tmp_path / "run"
    saved = load_config("furniture_train", cpu_scale=True).to_dict()
    saved["model"]["depth"] += 1
    fake_checkpoint(run_dir, 4, saved)
    assert launch.main(["furniture_train", "2", "--run-dir", str(run_dir), *TINY]) == 3
    err = capsys.readouterr().err
    assert "finished another run's settings: model.depth was 5, is now 4" in err, err
    assert "run complete:" not in err
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "preflight_failed"
    assert not fake_torchrun.calls


def test_a_damaged_checkpoint_that_cannot_be_moved_aside_refuses_the_launch(
    tmp_path, capsys, monkeypatch, fake_torchrun
):
    """A read-only checkpoints dir: the damaged newest checkpoint was reported "complete" (or resumed from)
    after "could not check the checkpoints"; now the launch is refused naming it, and nothing moves."""
    import errno

    from trainer.checkpoint import layout

    run_dir = tmp_path / "run"
    path = fake_checkpoint(run_dir, 4, load_config("furniture_train", cpu_scale=True).to_dict())
    with (path / "train_state.json").open("a") as f:
        f.write(" ")  # its size no longer the marker's

    def read_only(src, dst):
        raise OSError(errno.EROFS, "Read-only file system", str(src))

    monkeypatch.setattr(layout.os, "replace", read_only)
    assert launch.main(["furniture_train", "2", "--run-dir", str(run_dir), *TINY]) == 3
    err = capsys.readouterr().err
    assert f"{path} is damaged" in err and "could not be moved aside (Read-only file system)" in err, err
    assert "run complete:" not in err and path.is_dir() and not fake_torchrun.calls


def test_a_data_path_the_ranks_cannot_use_fails_preflight_naming_it(tmp_path, capsys, fake_torchrun):
    """A file, or a place no episodes can be generated in: the ranks' FileNotFoundError traceback before."""
    afile = tmp_path / "a-file"
    afile.write_text("")
    for path, said in ((afile, "is a file; set data.path"), (afile / "sub", "cannot be made or written")):
        run_dir = tmp_path / f"run-{path.name}"
        assert (
            launch.main(
                ["furniture_train", "2", "--run-dir", str(run_dir), "--set", f"data.path={path}", *TINY]
            )
            == 3
        )
        err = capsys.readouterr().err
        assert f"data.path={path}" in err and said in err, err
    assert not fake_torchrun.calls


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a read-only mount needs root")
def test_a_read_only_dataset_without_its_latent_cache_fails_preflight_naming_the_fix(tmp_path):
    """Found by a review: episodes on a read-only mount, no `.latents/` yet: the preflight passed, the ranks
    failed after the compile checks with a bare OSError, and the last line said the next run starts fresh."""
    from trainer.data.formats.generate import generate_dataset

    data = tmp_path / "ro"
    generate_dataset(data, 2, 20, "one_leg", seed=0)
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "trainer.launcher", "furniture_train", "1", "--run-dir", str(run_dir),
            "--set", f"data.path={data}", *TINY]  # fmt: skip
    script = f"mount --bind {data} {data} && mount -o remount,bind,ro {data} && exec {shlex.join(argv)}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LINGBOT_"))}
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env,
                          cwd=repo_root(), timeout=300)  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"the latent cache goes in {data / 'one_leg' / '.latents'}" in done.stderr
    assert "--set data.cache_dir=DIR" in done.stderr and not (data / "one_leg" / ".latents").exists()
    assert not list((run_dir / "attempts").glob("*/rank_*.json"))  # no rank started


def test_a_generated_folder_of_other_counts_is_said(tmp_path):
    """Found by a review: `--set data.generated_episodes=8` on a folder generated with 1 was ignored unsaid
    (and the split error that followed told the user to add episodes)."""
    from trainer.data.formats.generate import generate_dataset
    from trainer.launcher.inputs import inputs_check

    generate_dataset(tmp_path / "d", 1, 20, "one_leg", seed=0)
    sets = {"data.path": str(tmp_path / "d"), "data.generated_episodes": "8", "data.generated_length": "20"}
    note = inputs_check(load_config("furniture_train", cpu_scale=True, overrides=sets))[0]
    assert note.endswith(
        f"; generated earlier with episodes 1 (data.generated_episodes=8): those settings make a new folder "
        f"only (remove {tmp_path / 'd'} to generate again with them)"
    )
    same = inputs_check(
        load_config("furniture_train", cpu_scale=True, overrides={**sets, "data.generated_episodes": "1"})
    )
    assert "generated earlier" not in same[0]


def test_a_best_that_is_a_folder_fails_preflight_naming_the_fix(tmp_path, capsys, fake_torchrun):
    """Found by a review: a run dir copied with `cp -rL` has `checkpoints/best` as a folder; the run failed
    after its last save (os.replace onto a folder), and the rerun said "run complete" with no best."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "best").mkdir(parents=True)
    assert launch.main(["furniture_train", "2", "--run-dir", str(run_dir), *TINY]) == 3
    err = capsys.readouterr().err
    assert f"{run_dir / 'checkpoints' / 'best'} is a folder, not the link bin/train keeps" in err
    assert f"rm -r {run_dir / 'checkpoints' / 'best'}" in err and not fake_torchrun.calls


def test_a_resume_never_makes_new_episodes_for_its_checkpoint(tmp_path, capsys, fake_torchrun):
    """Found by a review: a resume whose data.path was mistyped (or moved) generated synthetic episodes there
    and trained on, exit 0: the checkpoint's run went on with other data."""
    from trainer.checkpoint.finite import FINITE_KEY

    run_dir, trained_on, empty = tmp_path / "run", tmp_path / "data", tmp_path / "data-typo"
    cfg = load_config(
        "furniture_train", cpu_scale=True, overrides={"train.steps": 4, "data.path": str(trained_on)}
    )
    ckpt = run_dir / "checkpoints" / "checkpoint_step_2"
    ckpt.mkdir(parents=True)
    (ckpt / "train_state.json").write_text(json.dumps({"step": 2, "world_size": 2, "config": cfg.to_dict()}))
    files = {"train_state.json": (ckpt / "train_state.json").stat().st_size}
    (ckpt / "COMPLETE").write_text(json.dumps({"step": 2, "files": files, FINITE_KEY: True}))
    argv = ["furniture_train", "2", "--run-dir", str(run_dir), "--set", f"data.path={empty}", *TINY]
    assert launch.main(argv) == 3
    err = capsys.readouterr().err
    assert (
        f"no episodes under {empty}, and this run resumes from {ckpt}, trained on data.path={trained_on}"
        in err
    )
    assert not empty.exists() and not fake_torchrun.calls
    # its own data.path, emptied (a requeue onto a node whose local data.path is empty): the run's generated
    # episodes are made again, the same (seeded; the generation settings are fixed on a resume)
    from trainer.launcher.inputs import inputs_check

    again = load_config("furniture_train", cpu_scale=True, overrides={"data.path": str(trained_on)})
    assert inputs_check(again, (ckpt, str(trained_on)))[0].startswith(
        f"data: no episodes under {trained_on}: the"
    )


# --- env choice and the ranks' environment ------------------------------------------------------------


def test_without_env_args_the_tool_env_is_used_loudly(tmp_path, capsys, passing_checks, fake_torchrun):
    run_dir = tmp_path / "run"
    assert launch.main(["furniture_train", "2", "--run-dir", str(run_dir), *TINY]) == 1  # fake ranks vanish
    err = capsys.readouterr().err
    assert f"no provisioned env found; running in the tool environment {sys.prefix}" in err
    assert "provision one with bin/provision lingbot-b200" in err
    ((command, env, attempt_dir),) = fake_torchrun.calls
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert command[command.index("--nproc-per-node") + 1] == "2"
    assert command[command.index("-m", 3) :][:2] == ["-m", "trainer.loop.train"]
    assert command[-2:] == ["--attempt-dir", str(attempt_dir)]  # the ranks get no config name, no --set
    ranks_config = json.loads((attempt_dir / "config.json").read_text())
    assert (
        ranks_config == load_config("furniture_train", cpu_scale=True, overrides={"train.steps": 4}).to_dict()
    )
    assert env["LINGBOT_ATTEMPT_DIR"] == str(attempt_dir) and attempt_dir.parent == run_dir / "attempts"
    assert str(repo_root()) in env["PYTHONPATH"].split(os.pathsep)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "before any rank started" in summary["reason"]


@pytest.mark.parametrize("how", ["--prefix", "CONDA_PREFIX", "default env"])
def test_a_provisioned_env_is_used_with_its_variables_applied(
    tmp_path, monkeypatch, passing_checks, fake_torchrun, how
):
    variables = "set CC ${CONDA_PREFIX}/bin/x86_64-conda-linux-gnu-cc\nset LINGBOT_GPU_KIND b200\n"
    if how == "default env":
        prefix = make_prefix(tmp_path / "envs" / "lingbot-b200", variables)
        extra = []
    else:
        prefix = make_prefix(tmp_path / "myenv", variables)
        extra = ["--prefix", str(prefix)] if how == "--prefix" else []
        if how == "CONDA_PREFIX":
            monkeypatch.setenv("CONDA_PREFIX", str(prefix))
    monkeypatch.setenv("CC", "/usr/bin/gcc")  # the login node's compiler must not leak into the job
    launch.main(["furniture_train", "2", "--run-dir", str(tmp_path / "run"), *TINY, *extra])
    ((command, env, _),) = fake_torchrun.calls
    assert command[0] == str(prefix / "bin" / "python")
    assert env["CC"] == f"{prefix}/bin/x86_64-conda-linux-gnu-cc"
    assert env["CONDA_PREFIX"] == str(prefix) and env["LINGBOT_GPU_KIND"] == "b200"
    assert env["PATH"].split(os.pathsep)[0] == str(prefix / "bin")


def test_explicit_env_must_be_complete_even_when_the_default_is(tmp_path):
    make_prefix(tmp_path / "envs" / "lingbot-b200")
    with pytest.raises(PreflightError, match="is not usable"):
        resolve_env(None, tmp_path / "missing", {})
    # An incomplete $CONDA_PREFIX (e.g. conda's base env) falls through to the default env.
    (tmp_path / "base").mkdir()
    choice = resolve_env(None, None, {"CONDA_PREFIX": str(tmp_path / "base")})
    assert choice.provisioned and choice.prefix == tmp_path / "envs" / "lingbot-b200"


def test_tool_env_skips_only_the_provision_bookkeeping_and_says_so(monkeypatch):
    checks = [
        Check("env.complete", FAIL, 0, "no manifest", "provision"),
        Check("variables.file", FAIL, 0, "no env-vars", "provision"),
        Check("compile.*", "SKIP", 0, "not run: the env's variables cannot be read"),
        Check("node.disk", PASS, 0, "plenty"),
    ]
    monkeypatch.setattr(provision.check, "run_checks", lambda prefix, **kw: report(*checks))
    notes = env_checks(tool_env(), {})
    assert any("not applicable, skipped: env.complete, variables.file" in n for n in notes)
    assert any("envcheck skipped compile.*" in n for n in notes)
    # The same failures on a provisioned env are real.
    with pytest.raises(PreflightError, match="env.complete: no manifest"):
        env_checks(EnvChoice(Path("/p"), Path("/p/bin/python"), provisioned=True), {})


# --- rendezvous, verdict, requeue, sbatch -------------------------------------------------------------


def args_for(*argv):
    return parse_args(["furniture_train", "4", *argv])


def test_rendezvous_comes_from_slurm_variables(tmp_path, monkeypatch):
    slurm = {
        "SLURM_JOB_ID": "1234",
        "SLURM_NNODES": "2",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
    }
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: the node list is parsed
    r = rendezvous(args_for(), slurm)
    assert (r.nnodes, r.node_rank, r.master_addr, r.master_port) == (2, 1, "gpu07", 20000 + 1234)
    assert r.attempt == "slurm1234-0"
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\necho gpu-a\necho gpu-b\n")
    scontrol.chmod(0o755)
    assert rendezvous(args_for(), {**slurm, "SLURM_RESTART_COUNT": "2"}).master_addr == "gpu-a"
    assert rendezvous(args_for(), {**slurm, "SLURM_RESTART_COUNT": "2"}).attempt == "slurm1234-2"
    assert rendezvous(args_for(), {**slurm, "SLURM_STEP_ID": "3"}).attempt == "slurm1234-0-step3"
    assert rendezvous(args_for("--master-addr", "h0", "--master-port", "999"), slurm).master_addr == "h0"


def test_rendezvous_on_one_node_and_manual_multinode():
    r = rendezvous(args_for(), {})  # torchrun --standalone binds its own port: none is picked here
    assert (r.nnodes, r.node_rank, r.master_addr, r.master_port) == (1, 0, "127.0.0.1", None)
    one_node_job = {"SLURM_JOB_ID": "1234", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "gpu07"}
    assert rendezvous(args_for(), one_node_job).master_port is None
    assert rendezvous(args_for("--master-port", "999"), one_node_job).master_port == 999
    assert rendezvous(args_for(), {"MASTER_PORT": "998"}).master_port == 998
    with pytest.raises(PreflightError, match="--master-addr"):
        rendezvous(args_for("--nnodes", "2", "--node-rank", "1"), {})
    with pytest.raises(PreflightError, match="LINGBOT_ATTEMPT_ID"):
        rendezvous(
            args_for("--nnodes", "2", "--node-rank", "1", "--master-addr", "h", "--master-port", "5"), {}
        )


def write_records(attempt_dir: Path, *records: dict) -> None:
    attempt_dir.mkdir(parents=True, exist_ok=True)
    for rec in records:
        (attempt_dir / f"rank_{rec['rank']}.json").write_text(json.dumps({"pid": 100 + rec["rank"], **rec}))


def rank_summary(run_dir: Path, status: str, attempt: str = "att") -> None:
    summary = {"status": status, "attempt": attempt, "reason": "r", "steps_requested": 4}
    (run_dir / "summary.json").write_text(json.dumps(summary))


def test_verdict_ignores_a_teardown_abort_once_every_rank_completed(tmp_path):
    write_records(tmp_path / "att", {"rank": 0, "status": "completed"}, {"rank": 1, "status": "completed"})
    rank_summary(tmp_path, "completed")
    v = verdict(2, 2, tmp_path / "att", tmp_path, "att", -6, [])
    assert v.status == "completed" and "teardown" in v.notes[0]


def test_verdict_zero_exit_without_every_completion_record_is_a_failure(tmp_path):
    write_records(tmp_path / "att", {"rank": 0, "status": "completed"}, {"rank": 1, "status": "running"})
    rank_summary(tmp_path, "completed")
    v = verdict(2, 2, tmp_path / "att", tmp_path, "att", 0, [])
    assert (v.status, v.failed_rank) == ("failed", 1)


def test_verdict_names_the_rank_with_the_real_error_not_its_peers(tmp_path):
    write_records(
        tmp_path / "att",
        {"rank": 0, "status": "failed", "error": "DistBackendError: Connection closed by peer", "time": 1.0},
        {"rank": 1, "status": "failed", "error": "ValueError: bad batch", "time": 2.0},
    )
    v = verdict(2, 2, tmp_path / "att", tmp_path, "att", 1, [])
    assert (v.status, v.failed_rank, v.rank_error) == ("failed", 1, "ValueError: bad batch")


def test_verdict_names_a_killed_rank_and_its_signal(tmp_path):
    write_records(
        tmp_path / "att",
        {"rank": 0, "status": "failed", "error": "RuntimeError: Connection reset by peer", "time": 1.0},
        {"rank": 1, "status": "running"},
    )
    rank_summary(tmp_path, "completed", attempt="an-older-attempt")  # not this attempt's: ignored
    tail = ["  rank      : 1 (local_rank: 1)\n", "  exitcode  : -9 (pid: 101)\n"]
    v = verdict(2, 2, tmp_path / "att", tmp_path, "att", 1, tail)
    assert (v.status, v.failed_rank) == ("failed", 1)
    assert "died without reporting an error: killed by SIGKILL" in v.rank_error


def test_requeue_asks_scontrol(tmp_path, monkeypatch):
    log = tmp_path / "calls"
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert requeue({"SLURM_JOB_ID": "77"}) == "requeued Slurm job 77"
    assert log.read_text() == "requeue 77\n"
    # Slurm takes a requeued job's processes down, scontrol among them when it is slow to answer (seen under
    # load: the job came back, the launcher had said "not requeued ... said: "): never "not requeued"
    scontrol.write_text("#!/bin/sh\nkill -TERM $$\n")
    said = requeue({"SLURM_JOB_ID": "78"})
    assert said.startswith("requeue of Slurm job 78 asked: scontrol was ended by SIGTERM"), said
    scontrol.write_text("#!/bin/sh\necho 'Invalid job id specified' >&2\nexit 1\n")
    said = requeue({"SLURM_JOB_ID": "79"})
    assert said == "not requeued: scontrol requeue 79 said: Invalid job id specified", said


def test_sbatch_script_is_ready_to_submit(tmp_path, capsys):
    argv = [
        "furniture_train",
        "4",
        "--env",
        "lingbot-b200",
        "--run-dir",  # a job script makes its run dir: not the checkout's default runs/furniture_train
        str(tmp_path / "run"),
        "--nnodes",
        "2",
        "--time",
        "12:00:00",
        "--sbatch",
    ]
    assert launch.main(argv) == 0
    script = capsys.readouterr().out
    for directive in (
        "--nodes=2", "--gpus-per-node=4", "--ntasks-per-node=1", "--time=12:00:00",
        "--signal=B:USR1@120", "--requeue",
    ):  # fmt: skip
        assert f"#SBATCH {directive}\n" in script
    # preflight with bin/train's own rules on every node, then the run (test_slurm.py submits it for real)
    assert "run_step bin/train furniture_train 4 --env lingbot-b200 --run-dir" in script
    assert script.count("--preflight-only\n") == 1 and script.count("--env-checked\n") == 1
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    if shutil.which("shellcheck"):
        check = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout

    out = tmp_path / "written.sbatch"
    assert launch.main([*argv, str(out)]) == 0
    assert out.read_text() == script and os.access(out, os.X_OK)


def test_sbatch_runs_the_command_line_it_was_given(tmp_path, capsys, monkeypatch):
    """Found by a review: the script (which cds to the checkout) took a relative --set path as the
    checkout's, dropped --no-requeue (and requeued on USR1 anyway), --master-addr and --master-port, broke
    its '# Generated by' comment (and with it every #SBATCH line after) on a value holding a newline, and
    took a --time shorter than the USR1 lead."""
    monkeypatch.chdir(tmp_path)
    prompt = "pick it up.\nthen put it down"
    argv = ["furniture_train", "2", "--run-dir", "rsb", "--set", "data.path=reldata",
            "--set", "data.cache_dir=c", "--set", f"data.prompt={prompt}", "--no-requeue",
            "--master-addr", "node7", "--master-port", "29999", "--sbatch"]  # fmt: skip
    assert launch.main(argv) == 0
    script = capsys.readouterr().out
    t = tmp_path
    train = (
        f"run_step bin/train furniture_train 2 --run-dir {t / 'rsb'} --set data.path={t / 'reldata'} "
        f"--set data.cache_dir={t / 'c'} --set 'data.prompt={prompt}' --no-requeue --master-addr node7 "
        "--master-port 29999 --"
    )
    assert script.count(train) == 2, script
    assert "scontrol requeue" not in script
    head = script.split("\nset -uo pipefail\n")[0].splitlines()
    assert all(line.startswith("#") for line in head) and "#SBATCH --time=24:00:00" in head
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert launch.main(["furniture_train", "2", "--sbatch", "-"]) == 0
    assert "scontrol requeue" in capsys.readouterr().out  # USR1 requeues unless --no-requeue
    for time_limit, lead in (("1", "120"), ("2:00", "120"), ("0-0:10", "600")):
        assert (
            launch.main(["furniture_train", "2", "--sbatch", "--time", time_limit, "--signal-lead", lead])
            == 2
        )
        assert f"--time {time_limit} is not longer than --signal-lead {lead} s" in capsys.readouterr().err
    assert launch.main(["furniture_train", "2", "--sbatch", "--time", "3", "--signal-lead", "60"]) == 0
    for no_limit in ("0", "unlimited"):  # sbatch's "no time limit", both (a review: 0 was refused)
        assert launch.main(["furniture_train", "2", "--sbatch", "--time", no_limit]) == 0
    capsys.readouterr()
    for flag in ("--partition", "--run-dir"):  # a line break would end sbatch's reading of #SBATCH lines
        assert launch.main(["furniture_train", "2", "--sbatch", flag, "gpu\nx"]) == 2
        assert f"{flag} " in capsys.readouterr().err
    # every root of several is the working directory's, and a value is stripped as parse_set strips it
    assert launch.main(["furniture_train", "2", "--sbatch", "--set", "data.format=lerobot", "--set",
                        "data.path=ds/a, ds/b", "--set", "data.cache_dir= /abs/c"]) == 0  # fmt: skip
    assert f"data.path={t / 'ds/a'},{t / 'ds/b'} --set data.cache_dir=/abs/c " in capsys.readouterr().out


def test_a_stop_signal_during_preflight_stops_before_any_rank(tmp_path, monkeypatch, fake_torchrun):
    def checks_then_signal(prefix, **kw):
        os.kill(os.getpid(), signal.SIGTERM)  # Slurm's warning arriving while the preflight runs
        return report(Check("x", PASS, 0.0, "ok"))

    monkeypatch.setattr(provision.check, "run_checks", checks_then_signal)
    run_dir = tmp_path / "run"
    before = signal.getsignal(signal.SIGTERM)
    assert launch.main(["furniture_train", "2", "--run-dir", str(run_dir), *TINY]) == 75
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "preempted" and "before any rank started" in summary["reason"]
    assert nothing_written(run_dir) and not fake_torchrun.calls
    assert signal.getsignal(signal.SIGTERM) is before  # the launcher's handlers are gone again
    # a run that trained before keeps its history (a review: a requeue stopped in preflight, routine under
    # Slurm, wiped the last run's losses and its last checkpoint from summary.json), through two such stops
    write_summary(run_dir, Summary(COMPLETED, steps_requested=4, final_losses={"loss": 0.5}, attempt="a1"))
    for _ in range(2):
        assert launch.main(["furniture_train", "2", "--run-dir", str(run_dir), *TINY]) == 75
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "preempted" and summary["previous_status"] == "completed"
        assert summary["previous"]["final_losses"] == {"loss": 0.5}


def test_torchrun_error_files_name_the_global_rank(tmp_path, monkeypatch):
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    attempt = tmp_path / "att"
    error_file = attempt / "node1" / "att" / "attempt_0" / "0" / "error.json"  # node 1, local rank 0
    error_file.parent.mkdir(parents=True)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    try:
        raise ValueError("bad episode file")
    except ValueError as exc:
        ErrorHandler().record_exception(exc)
    found = torchrun_error_files(attempt, nproc=2)
    assert list(found) == [2] and "bad episode file" in found[2]["error"]
    # A rank that failed before writing its own record is still named, with its error.
    v = verdict(4, 2, attempt, tmp_path, "att", 1, [])
    assert (v.status, v.failed_rank) == ("failed", 2) and "bad episode file" in v.reason


def test_summary_says_running_before_any_rank_starts(tmp_path, passing_checks, fake_torchrun):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_summary(run_dir, Summary(COMPLETED, steps_requested=2, attempt="earlier"))
    assert launch.main(["furniture_train", "2", "--run-dir", str(run_dir), *TINY]) == 1  # fake ranks vanish
    ((_, _, attempt_dir),) = fake_torchrun.calls
    start = fake_torchrun.summary_at_start
    assert (start["status"], start["attempt"], start["steps_requested"]) == ("running", attempt_dir.name, 4)
    assert start["exit_code"] is None and start["previous_status"] == "completed"
    end = json.loads((run_dir / "summary.json").read_text())
    assert end["status"] == "failed" and end["attempt"] == attempt_dir.name  # never the earlier `completed`


@pytest.mark.fast
def test_an_attempt_counts_as_used_only_for_another_launchs_files(tmp_path):
    """What every node of a multi-node attempt writes (config.json, its atomic write's temporary file,
    node<N>/ and node<N>.log) never makes node 0 refuse the attempt; a rank record or a stop file does."""
    from provision.atomic import write_json_atomic

    attempt = Attempt.of_run(tmp_path / "run", "slurm7-0-step1")
    assert not attempt.used()
    attempt.dir.mkdir(parents=True)
    attempt.write_config(load_config("furniture_train", cpu_scale=True, overrides={}))
    (attempt.dir / ".config.json.k2j4x1.tmp").write_text("{")  # node 1's write, caught mid-way
    attempt.node_log_dir(1).mkdir()
    attempt.output_log(1).write_text("")
    assert not attempt.used()
    for evidence in ("rank_0.json", "stop"):
        write_json_atomic(attempt.dir / evidence, {})
        assert attempt.used(), evidence
        (attempt.dir / evidence).unlink()
    (attempt.dir / ".rank_0.json.x.tmp").write_text("")  # any other file is another launch's
    assert attempt.used()


def test_one_node_meets_on_loopback_or_on_the_address_given():
    """Issue 56 item 11: torchrun --standalone advertised the node's hostname (one that does not resolve
    hung the ranks); one node now meets on 127.0.0.1, torchrun still binding its own port, and a user's
    MASTER_ADDR (or --master-addr) is honoured on one node too."""
    r = rendezvous(args_for(), {})
    assert r.torchrun_flags() == ["--standalone", "--local-addr", "127.0.0.1"]
    one_node_job = {"SLURM_JOB_ID": "1234", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "gpu07"}
    assert rendezvous(args_for(), one_node_job).torchrun_flags()[-1] == "127.0.0.1"
    assert rendezvous(args_for(), {"MASTER_ADDR": "10.1.2.3"}).torchrun_flags() == [
        "--standalone", "--local-addr", "10.1.2.3"
    ]  # fmt: skip
    assert rendezvous(args_for("--master-addr", "h1"), {}).torchrun_flags()[-1] == "h1"
