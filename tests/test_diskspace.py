"""Full disks and quotas on real small filesystems (tmpfs mounted and unmounted by the test, as root).

Each case runs `python -m trainer.launch` (what bin/train execs) on 2 CPU ranks with a tiny model and the
run dir on a tmpfs, and asserts the one-line message, the exit code, a summary.json that does not claim
success, no traceback on the terminal, and that a re-run after freeing space resumes and completes.
Where mounting is not allowed the tests skip with the reason (they never pass without running).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainer.checkpoint_layout import damage, scan
from trainer.checkpoint_size import estimate_bytes, model_size
from trainer.config import load_config

REPO = Path(__file__).resolve().parents[1]
STEPS = 6
TINY = [
    "model.dim=48", "model.heads=2", "model.depth=2", "model.latent_size=8", "model.attn_block=16",
    "data.frames=4", "data.generated_episodes=4", "data.generated_length=20",
    "train.grad_accum=2", f"train.steps={STEPS}", "train.warmup_steps=2",
    "checkpoint.every=2", "checkpoint.keep=2", "log.tensorboard=false",
]  # fmt: skip
TIMEOUT = 240

pytestmark = pytest.mark.slow


def tiny_config():
    overrides = dict(item.split("=", 1) for item in TINY)
    return load_config("furniture_train", cpu_scale=True, overrides=overrides)


def one_checkpoint() -> int:
    cfg = tiny_config()
    return estimate_bytes(cfg, model_size(cfg), 2)


class Tmpfs:
    def __init__(self, path: Path, size: int):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        out = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
        )
        if out.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({out.stderr.strip() or out.returncode}): needs root")

    def resize(self, size: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True)

    def fill(self) -> Path:
        """Write a filler file until the filesystem is full; returns it (delete it to free the space)."""
        filler = self.path / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        return filler

    def umount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False)


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
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LINGBOT_", "SLURM_", "CONDA_PREFIX"))}
    env["CONDA_ENVS_PATH"] = str(tmp_path_factory.mktemp("no-envs"))  # no provisioned env: the tool env
    env["OMP_NUM_THREADS"] = "1"
    return env


def launch(
    run_dir: Path, data_dir: Path, env: dict[str, str], *sets: str, extra_env=None
) -> subprocess.Popen:
    argv = [sys.executable, "-m", "trainer.launch", "furniture_train", "2", "--run-dir", str(run_dir)]
    for item in [*TINY, f"data.path={data_dir}", *sets]:
        argv += ["--set", item]
    return subprocess.Popen(
        argv,
        cwd=REPO,
        env={**env, **(extra_env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, out, err


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def launcher_lines(err: str, text: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("[bin/train]") and text in line]


def assert_said_once(err: str, fs: Tmpfs) -> str:
    lines = launcher_lines(err, "out of space on")
    assert len(lines) == 1, err
    line = lines[0]
    assert f"on {fs.path} (tmpfs)" in line and " free, needed " in line and "fix: free space" in line
    assert "checkpoint.keep" in line and "--run-dir" in line
    assert "Traceback" not in err, err
    return line


def wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"launcher exited {proc.returncode} before {path}:\n{proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {path}")
        time.sleep(0.02)  # polling for an event, with a deadline: not a sleep standing in for one


def test_preflight_refuses_a_run_dir_that_cannot_hold_keep_plus_one(tmp_path, tmpfs, data_dir, base_env):
    one = one_checkpoint()
    fs = tmpfs(int(one * 2.5))  # keep 2 + 1 = 3 checkpoints do not fit
    run_dir = fs.path / "run"
    rc, out, err = finish(launch(run_dir, data_dir, base_env))
    assert rc == 3, err
    (line,) = launcher_lines(err, "cannot hold checkpoint.keep + 1 = 3 checkpoints")
    assert "needs" in line and "free" in line and "skip_space_check" in line
    assert summary(run_dir)["status"] == "preflight_failed" and not (run_dir / "checkpoints").exists()
    assert "Traceback" not in err


def test_out_of_space_during_a_save_is_one_line_and_a_rerun_resumes(tmp_path, tmpfs, data_dir, base_env):
    one = one_checkpoint()
    fs = tmpfs(int(one * 1.6))  # one checkpoint fits, the second save runs out of space
    run_dir = fs.path / "run"
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


def test_out_of_space_writing_the_final_summary_never_claims_success(tmp_path, tmpfs, data_dir, base_env):
    one = one_checkpoint()
    fs = tmpfs(one * 8)
    run_dir = fs.path / "run"
    pause = tmp_path / "pause"
    pause.mkdir()
    extra = {"LINGBOT_TEST_PAUSE_AT": f"summary:{STEPS}", "LINGBOT_TEST_PAUSE_DIR": str(pause)}
    proc = launch(run_dir, data_dir, base_env, extra_env=extra)
    wait_for(pause / "reached", proc)
    filler = fs.fill()  # the disk fills up while rank 0 is about to write summary.json
    (pause / "release").touch()
    rc, out, err = finish(proc)
    assert rc == 1, err
    line = assert_said_once(err, fs)
    assert "during the summary write of" in line
    assert launcher_lines(err, "could not write the summary")  # said on stderr, as it is not on disk
    s = summary(run_dir)
    assert s["status"] == "running" and s["exit_code"] is None  # this attempt's `running`: not done

    filler.unlink()  # free space: the re-run finds the last step saved and says the run is complete
    rc, out, err = finish(launch(run_dir, data_dir, base_env))
    assert rc == 0, err
    assert summary(run_dir)["status"] == "completed"


@pytest.mark.skip(
    reason="open defect (issue 15): with the merged collector-format data the first, generating run of this "
    "scenario exits 1 on the small data filesystem; not yet diagnosed, so this case is not claimed"
)
def test_out_of_space_in_the_latent_cache(tmp_path, tmpfs, base_env):
    import importlib.util

    if importlib.util.find_spec("trainer.data.cache") is None:
        pytest.skip(
            "trainer/data in this tree warns and goes on when the latent cache cannot be written; "
            "the data engineer's trainer/data/cache.py raises ENOSPC (merge it to run this case)"
        )
    fs = tmpfs(64 << 20, "data")  # the collector-format episodes (two 224 px views) fit, then it is filled
    data = fs.path / "furniture"
    run_fs = tmpfs(one_checkpoint() * 8, "runfs")
    run_dir = run_fs.path / "run"
    # the episodes fit; the cache beside them does not (filled after generation)
    gen = launch(run_dir, data, base_env, "train.steps=1", "data.latent_cache=false")
    assert finish(gen)[0] == 0
    filler = fs.fill()
    rc, out, err = finish(launch(run_dir, data, base_env, "train.steps=2"))
    assert rc == 1, err
    line = assert_said_once(err, fs)
    assert "latent cache" in line
    assert summary(run_dir)["status"] == "failed"
    filler.unlink()
    rc, out, err = finish(launch(run_dir, data, base_env, "train.steps=2"))
    assert rc == 0, err
    assert summary(run_dir)["status"] == "completed"
