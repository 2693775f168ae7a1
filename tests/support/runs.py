"""Tiny training runs for the end-to-end tests: the one place for what test_resume, test_two_nodes,
test_slurm, test_diskspace/test_quota (through diskfull) and test_train_json share.

tiny(...)          the `--set` list of a tiny run (a 48-wide, 2-deep model on 4 generated episodes; a
                   600 s step stall limit: tests park ranks in a step for as long as they need).
clean_env(no_envs) a launch environment: no provisioned env (CONDA_ENVS_PATH an empty dir), no
                   LINGBOT_/SLURM_/CONDA_PREFIX/MASTER_* variables, OMP_NUM_THREADS=1.
launch / finish    `python -m trainer.launcher` (what bin/train execs) as a Popen; its exit and output.
wait_for           a file under a dir, with a deadline, failing early (with the output) if the launcher exits.
pause_env/release  the LINGBOT_TEST_PAUSE_* hook (trainer/testhooks.py): a rank announces itself in
                   PAUSE_DIR/reached and waits for PAUSE_DIR/release.
summary, losses_by_step, complete_steps   what a run dir says.
seed_preflight     copy the session's recorded compile-check pass into a run dir (see below).

The recorded pass (trainer/launcher/preflight.py's rule): the compile checks of bin/train's preflight are
real compiles, the slow part of every launch. A pass is recorded in RUN_DIR/preflight/<host>.json under a
key (node, boot, env, variables, check code) and reused by a later attempt under the same key. The session
fixture `preflight_record` (tests/conftest.py) runs one real `--preflight-only` launch with clean_env's
variables; `seed_preflight` puts that record in a new run dir, so a launch there reuses the pass exactly as
a requeue onto the same node would (and, under any other key, recompiles: the product decides, not the
test). Tests of the preflight itself never seed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STEPS = 6
TIMEOUT = 600  # a deadline per launch or wait (a launch on a loaded 2-core host can take minutes)
RECORD = Path("preflight") / f"{socket.gethostname()}.json"  # trainer.launcher.preflight.record_path


def tiny(
    steps: int = STEPS, keep: int | None = 2, tensorboard: bool | None = False, grad_accum: int = 2
) -> list[str]:
    """The tiny run's overrides (keep or tensorboard None: the config's own setting)."""
    out = [
        "model.dim=48", "model.heads=2", "model.depth=2", "model.latent_size=8", "model.attn_block=16",
        "data.frames=4", "data.generated_episodes=4", "data.generated_length=20", "data.val_episodes=1",
        f"train.grad_accum={grad_accum}", f"train.steps={steps}", f"train.warmup_steps={min(2, steps - 1)}",
        f"checkpoint.every={min(2, steps)}",
        # these runs park ranks inside a step (the pause hook) for as long as a test needs: a plain step's
        # stall limit above that (the default floor, 60 s, is for real steps; test_hang sets its own)
        "hang.floor_s=600",
    ]  # fmt: skip
    if keep is not None:
        out.append(f"checkpoint.keep={keep}")
    if tensorboard is not None:
        out.append(f"log.tensorboard={str(tensorboard).lower()}")
    return out


def set_args(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


MACHINE_VARS = ("LINGBOT_SIM_HOME", "LINGBOT_FIXTURES_CACHE")  # where this machine's built envs live


def clean_env(no_envs: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if (not k.startswith(("LINGBOT_", "SLURM_", "CONDA_PREFIX")) or k in MACHINE_VARS)
        and k not in ("MASTER_ADDR", "MASTER_PORT")
    }
    no_envs.mkdir(parents=True, exist_ok=True)
    env["CONDA_ENVS_PATH"] = str(no_envs)  # no provisioned env: the tool env (said loudly)
    env["OMP_NUM_THREADS"] = "1"
    return env


def launch(
    run_dir: Path,
    data_dir: Path,
    env: dict[str, str],
    *sets: str,
    overrides: list[str] | None = None,
    nproc: int = 2,
    extra_env: dict[str, str] | None = None,
    split_stderr: bool = False,
) -> subprocess.Popen:
    """`python -m trainer.launcher furniture_train NPROC` on the tiny run (or `overrides`) plus `sets`;
    stderr joins stdout unless `split_stderr`."""
    argv = launcher_argv(run_dir, nproc)
    argv += set_args([*(tiny() if overrides is None else overrides), f"data.path={data_dir}", *sets])
    return subprocess.Popen(
        argv,
        cwd=REPO,
        env={**env, **(extra_env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if split_stderr else subprocess.STDOUT,
        text=True,
    )


def launcher_argv(run_dir: Path, nproc: int = 2) -> list[str]:
    """`python -m trainer.launcher furniture_train NPROC --run-dir RUN_DIR`: what bin/train execs."""
    launcher = [sys.executable, "-m", "trainer.launcher"]
    return [*launcher, "furniture_train", str(nproc), "--run-dir", str(run_dir)]


def finish(proc: subprocess.Popen, timeout: float = TIMEOUT) -> tuple[int, str, str]:
    """(exit status, stdout, stderr: empty unless split); kills the launcher if it outlives `timeout`."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"launcher still running after {timeout} s:\n{out}\n{err or ''}") from None
    return proc.returncode, out, err or ""


def wait_for(
    root: Path,
    pattern: str,
    proc: subprocess.Popen,
    ignore: frozenset[Path] = frozenset(),
    timeout: float = TIMEOUT,
) -> Path:
    """The first file under `root` matching `pattern` (not in `ignore`), while the launcher runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(set(root.glob(pattern)) - ignore)
        if found:
            return found[0]
        if proc.poll() is not None:
            stream = proc.stderr if proc.stderr is not None else proc.stdout
            output = stream.read() if stream is not None else ""
            raise AssertionError(f"launcher exited {proc.returncode} before {root}/{pattern}:\n{output}")
        time.sleep(0.02)  # polling for an event, with a deadline: not a sleep standing in for one
    proc.kill()
    raise AssertionError(f"timed out after {timeout} s waiting for {root}/{pattern}")


def said(lines: list[str], predicate, timeout: float = 30) -> bool:
    """Whether a program's output, read into `lines` by a thread, comes to satisfy `predicate`, polled
    with a deadline: a server's log line for a request reaches `lines` a moment after its reply."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate(list(lines)):
            return True
        time.sleep(0.05)  # polling the reader thread's list, with a deadline
    return False


def pause_env(pause_dir: Path, point: str, rank: int = 0) -> dict[str, str]:
    pause_dir.mkdir(parents=True, exist_ok=True)
    return {
        "LINGBOT_TEST_PAUSE_AT": point,
        "LINGBOT_TEST_PAUSE_RANK": str(rank),
        "LINGBOT_TEST_PAUSE_DIR": str(pause_dir),
    }


def release(pause_dir: Path) -> None:
    (pause_dir / "release").touch()


def reached(pause_dir: Path) -> dict | None:
    """What the paused process wrote in PAUSE_DIR/reached (its rank and pid), or None before it did."""
    try:
        return json.loads((pause_dir / "reached").read_text())
    except (OSError, ValueError):
        return None


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def losses_by_step(run_dir: Path) -> dict[int, tuple[float, float]]:
    """Per step, the (latent, action) losses of the last attempt that ran it."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        out[record["step"]] = (record["latent_loss"], record["action_loss"])
    return out


def complete_steps(run_dir: Path) -> list[int]:
    root = run_dir / "checkpoints"
    return sorted(
        int(p.name.split("_")[-1]) for p in root.glob("checkpoint_step_*") if (p / "COMPLETE").exists()
    )


def record_preflight(seed_dir: Path, env: dict[str, str]) -> Path:
    """One real `--preflight-only` launch in `seed_dir` (its compile checks run and pass); the record."""
    done = subprocess.run(
        [sys.executable, "-m", "trainer.launcher", "furniture_train", "2", "--run-dir", str(seed_dir),
         "--preflight-only", *set_args(tiny())],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, f"--preflight-only exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    record = seed_dir / RECORD
    assert record.is_file(), f"--preflight-only passed but recorded nothing at {record}:\n{done.stderr}"
    return record


def seed_preflight(run_dir: Path, record: Path) -> None:
    """Put the session's recorded pass where a launch in `run_dir` looks for it."""
    (run_dir / RECORD).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(record, run_dir / RECORD)
