"""The LIBERO evaluation's parts that need no simulator: the input checks, the asset manifest check, the
worker pool's crash handling (with stand-in workers), the counting and the progress line.
The real simulator runs in tests/test_sim_libero.py (heavy)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from trainer.evaluation.sim.report import Progress, record_path, summarise, write_results
from trainer.evaluation.sim.runner import Pool
from trainer.serving.protocol import Spec
from trainer.sim import assets, suites

pytestmark = pytest.mark.fast

LIBERO = Spec(suites.CAMERAS, 7, 4, 4)


@pytest.mark.parametrize("suite", suites.SUITES)
def test_every_suite_has_ten_tasks_in_the_manifest(suite):
    assert suites.task_count(suite) == 10


def test_tasks_parse_ranges_and_lists_and_refuse_out_of_range():
    assert suites.parse_tasks(None, 10) == list(range(10))
    assert suites.parse_tasks("all", 10) == list(range(10))
    assert suites.parse_tasks("0-2,5,1", 10) == [0, 1, 2, 5]
    for bad in ("10", "3-1", "-1", "x", "0-10"):
        with pytest.raises(suites.UsageError, match="--tasks"):
            suites.parse_tasks(bad, 10, "libero_10")


def test_unknown_suite_and_counts_are_refused():
    with pytest.raises(suites.UsageError, match="--suite 'libero_90'.*one of libero_10"):
        suites.task_count("libero_90")
    with pytest.raises(suites.UsageError, match="--episodes 0"):
        suites.check_counts(0, 800, 1)


def test_a_run_libero_cannot_drive_is_refused_naming_why():
    suites.check_served(LIBERO, "run")
    with pytest.raises(suites.UsageError, match="8 action channels.*takes 7"):
        suites.check_served(Spec(suites.CAMERAS, 8, 4, 4), "run")
    with pytest.raises(suites.UsageError, match="N = 6 .*multiple of 4"):
        suites.check_served(Spec(suites.CAMERAS, 7, 4, 6), "run")
    with pytest.raises(suites.UsageError, match="--camera"):
        suites.check_served(Spec(("front", "wrist"), 7, 4, 4), "run")
    aliased = Spec(
        ("front", "wrist"), 7, 4, 4, aliases=((suites.CAMERAS[0], "front"), (suites.CAMERAS[1], "wrist"))
    )
    suites.check_served(aliased, "run")


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    site, spec = tmp_path / "site", tmp_path / "spec"
    spec.mkdir()
    for manifest, under in assets.MANIFESTS.items():
        f = site / under / "a" / "x.txt"
        f.parent.mkdir(parents=True)
        f.write_text(f"{manifest}\n")
        (spec / manifest).write_text(f"{assets.blob_hash(f)}  a/x.txt\n")
    return site, spec


def test_asset_check_passes_upstream_files_and_names_a_changed_or_missing_one(tmp_path, capsys):
    site, spec = _tree(tmp_path)
    assert assets.main([str(site), str(spec)]) == 0
    (site / "libero/libero/assets/a/x.txt").write_text("changed\n")
    (site / "libero/libero/init_files/a/x.txt").unlink()
    assert assets.main([str(site), str(spec)]) == 1
    err = capsys.readouterr().err
    assert "libero/libero/assets/a/x.txt: blob" in err and "is not upstream's" in err
    assert "libero/libero/init_files/a/x.txt: missing" in err
    assert "2 of 3 files differ" in err


def test_blob_hash_is_gits():
    # `printf 'hello\n' | git hash-object --stdin`
    import tempfile

    with tempfile.NamedTemporaryFile() as f:
        f.write(b"hello\n")
        f.flush()
        assert assets.blob_hash(Path(f.name)) == "ce013625030ba8dba906f756967f9e9ca394464a"


FAKE_WORKER = """
import json, os, sys
for line in sys.stdin:
    job = json.loads(line)
    if job["episode"] == 1:
        os.abort()
    print(json.dumps({**job, "success": job["task"] == 0}), flush=True)
"""


def test_a_crashed_worker_is_its_episodes_error_and_the_others_go_on(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(FAKE_WORKER)
    pool = Pool([sys.executable, str(script)], {}, workers=2, logs=tmp_path / "logs")
    jobs = [(t, e) for t in (0, 1) for e in range(3)]
    records = {(r["task"], r["episode"]): r for r in pool.run(jobs)}
    assert set(records) == set(jobs)
    for t in (0, 1):
        assert "killed by SIGABRT" in records[(t, 1)]["error"]
        assert "success" not in records[(t, 1)]
        assert records[(t, 0)]["success"] is (t == 0) and records[(t, 2)]["success"] is (t == 0)


def test_counting_reads_the_records_and_keeps_errors_apart(tmp_path):
    out = tmp_path / "out"
    for (t, e), ok in {(0, 0): True, (0, 1): False, (2, 0): True}.items():
        path = record_path(out, t, e)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"task": t, "episode": e, "language": f"task {t}", "success": ok,
                                    "timing": {"render": 1.0}}))  # fmt: skip
    errors = [{"task": 2, "episode": 1, "error": "simulator worker killed by SIGABRT"}]
    result = summarise(out, "libero_goal", "ckpt", [0, 2], 2, errors, 12.0, {})
    assert (result["episodes"], result["successes"], result["success_rate"]) == (3, 2, 2 / 3)
    assert [(r["task"], r["episodes"], r["successes"], r["rate"]) for r in result["tasks"]] == [
        (0, 2, 1, 0.5), (2, 1, 1, 1.0)]  # fmt: skip
    assert result["missing"] == 1 and result["errors"] == errors
    assert result["episode_seconds"] == {"render": 3.0}
    write_results(out, result)
    assert json.loads((out / "results.json").read_text())["successes"] == 2
    assert (out / "success.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_line_counts_and_estimates(capsys):
    lines: list[str] = []
    p = Progress("libero_10", 4, 1, lines.append, tty=False)
    p.update({"task": 0, "episode": 1, "success": True})
    p.update({"task": 0, "episode": 2, "error": "simulator worker exited 1"})
    assert "2/4 episodes, 1 success, 0 error" in lines[0]
    assert "3/4 episodes, 1 success, 1 error" in lines[1] and "ETA 0:00:0" in lines[1]


SPEC = Path(__file__).resolve().parents[1] / "sim" / "libero"


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line and not line.startswith("-"):
            name, _, version = line.rstrip(" \\").partition("==")
            out[name.strip().lower()] = version.strip()
    return out


@pytest.mark.parametrize("name", ["requirements", "nodeps"])
def test_the_sim_locks_hold_every_pin_with_hashes(name):
    """A pin changed in sim/libero/*.in without re-locking (the command: docs/evaluation.md) fails here."""
    wanted, locked = _pins(SPEC / f"{name}.in"), _pins(SPEC / f"{name}.lock")
    for pkg, version in wanted.items():
        assert locked.get(pkg) == version, f"sim/libero/{name}.lock: {pkg}=={version} not locked; re-lock"
    text = (SPEC / f"{name}.lock").read_text()
    blocks = [b for b in text.split("\n") if "==" in b and not b.startswith(" ")]
    assert len(blocks) == len(locked) and text.count("--hash=sha256:") >= len(locked)


def test_the_committed_manifests_are_upstreams_counts():
    counts = {m: len(assets.read_manifest(SPEC / m)) for m in assets.MANIFESTS}
    assert counts == {"assets-8f1084e.txt": 585, "bddl-8f1084e.txt": 135, "init-8f1084e.txt": 250}


BLOCKING_WORKER = """
import json, sys
first = json.loads(sys.stdin.readline())
print(json.dumps({**first, "success": False}), flush=True)
sys.stdin.readline()  # the second job: never answered (a long episode)
sys.stdin.read()      # held here until the pool ends it
"""


def test_stop_ends_the_workers_and_records_no_error_for_their_episodes(tmp_path):
    """Ctrl-C (the command calls stop()): what finished is kept, the running episode is neither a result
    nor an error, the workers are gone."""
    script = tmp_path / "worker.py"
    script.write_text(BLOCKING_WORKER)
    pool = Pool([sys.executable, str(script)], {}, workers=1, logs=tmp_path / "logs")
    got = []
    for record in pool.run([(0, 0), (0, 1), (0, 2)]):
        got.append(record)
        pool.stop()
    assert got == [{"task": 0, "episode": 0, "success": False}]
    assert all(p.poll() is not None for p in pool.procs.values())


SILENT_WORKER = """
import json, sys
for line in sys.stdin:
    job = json.loads(line)
    if job["episode"] == 0:
        sys.stdin.read()  # a hung simulator: never answers
    print(json.dumps({**job, "success": True}), flush=True)
"""


def test_a_hung_worker_is_ended_and_its_episode_is_an_error(tmp_path):
    """A worker that answers nothing within the episode timeout is ended; its episode is an error naming
    the hang, and a fresh worker runs the slot's next job."""
    script = tmp_path / "worker.py"
    script.write_text(SILENT_WORKER)
    pool = Pool([sys.executable, str(script)], {}, workers=1, logs=tmp_path / "logs", episode_timeout=3.0)
    records = {(r["task"], r["episode"]): r for r in pool.run([(0, 0), (0, 1)])}
    assert "answered nothing within 3 s (hung; ended it)" in records[(0, 0)]["error"]
    assert records[(0, 1)] == {"task": 0, "episode": 1, "success": True}
    assert all(proc.poll() is not None for proc in pool.procs.values())


def test_one_writer_per_output_folder(tmp_path):
    """A second bin/evaluate --sim on a folder another is writing is refused (exit 1: the launcher's
    evaluator retries it later); the folder is free again once the first ends."""
    import os

    from trainer.evaluation.sim.command import hold_output
    from trainer.sim.env import SimEnvError

    out = tmp_path / "libero" / "libero_goal"
    first = hold_output(out)
    with pytest.raises(SimEnvError, match="another bin/evaluate --sim is writing there now"):
        hold_output(out)
    os.close(first)
    os.close(hold_output(out))


def test_a_damaged_episode_record_or_settings_file_is_named_with_its_fix(tmp_path):
    """bin/evaluate --sim reads back what it wrote; a damaged one was a JSONDecodeError traceback."""
    from trainer.evaluation.sim.command import check_settings
    from trainer.evaluation.sim.report import load_records, record_path
    from trainer.sim import suites

    path = record_path(tmp_path, 0, 1)
    path.parent.mkdir(parents=True)
    path.write_text('{"success": tr')
    with pytest.raises(
        suites.UsageError, match=f"{path}: unreadable .*the re-run plays that episode again: rm"
    ):
        load_records(tmp_path, [0], 2)
    (tmp_path / "settings.json").write_text("{")
    with pytest.raises(suites.UsageError, match="settings.json: unreadable"):
        check_settings(tmp_path, {"suite": "libero_goal"})


def test_the_simulator_env_is_refused_on_a_platform_its_lock_has_no_wheels_for(tmp_path, monkeypatch):
    """Issue 56 item 6: sim/libero/requirements.lock names one torch wheel (x86_64); an aarch64 node took an
    x86 .sim/libero as ready and then failed naming EGL packages. Each way in refuses first, naming the
    platform and what to do; sim/build.sh keys the env by platform and refuses too."""
    import subprocess

    from trainer.evaluation.sim.command import Options, run_libero
    from trainer.launcher.errors import PreflightError
    from trainer.launcher.inputs import inputs_check
    from trainer.launcher.preflight import sim_platform_check
    from trainer.sim import env

    assert env.platforms("libero") == ("x86_64",)
    lock = (env.REPO / "sim" / "libero" / "requirements.lock").read_text()
    torch_entry = lock.split("\ntorch==", 1)[1].split("\n    #", 1)[0]
    assert torch_entry.count("--hash=") == len(env.platforms("libero")), "a wheel added: list its platform"
    env.check_platform("libero", "", "x86_64")
    with pytest.raises(env.SimEnvError, match=r"aarch64.*x86_64.*do this"):
        env.check_platform("libero", "do this", "aarch64")

    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    with pytest.raises(env.SimEnvError, match="aarch64"):  # before the checkpoint is even looked for
        run_libero(str(tmp_path / "no-run"), Options(), print)
    from trainer.config import load_config

    cfg = load_config("libero", cpu_scale=False)  # eval.sim libero: the launcher's evaluator
    with pytest.raises(PreflightError, match=r"aarch64.*eval\.sim=none"):
        sim_platform_check(cfg)
    cfg.eval.sim = "none"
    sim_platform_check(cfg)
    recorded = load_config("libero", cpu_scale=True, overrides={"data.path": str(tmp_path / "data")})
    with pytest.raises(PreflightError, match=r"aarch64.*data\.path"):  # the CPU scale's recording
        inputs_check(recorded, None)

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "uname").write_text("#!/bin/sh\necho aarch64\n")
    (fake / "uname").chmod(0o755)
    run = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "LINGBOT_SIM_HOME": str(tmp_path / "sim"),
           "LINGBOT_BASE_PYTHON": str(tmp_path / "no-python")}  # fmt: skip
    done = subprocess.run([str(env.REPO / "sim" / "build.sh"), "libero"], env=run, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and not done.stdout, (done.stdout, done.stderr)
    assert "aarch64" in done.stderr and "x86_64" in done.stderr, done.stderr


def test_a_second_writer_is_refused_before_the_model_loads(tmp_path):
    """Issue 56 item 8: the output folder is taken before the checkpoint is loaded, so a second writer is
    refused at once (it was refused only after a full model load; here the target does not even exist, and
    the old order said so instead); a refused bad input leaves no folder behind."""
    import os

    from trainer.evaluation.sim.command import Options, hold_output, run_libero
    from trainer.sampling.load import TargetError
    from trainer.sim.env import SimEnvError

    out = tmp_path / "evaluation" / "libero" / "libero_goal"
    opts = Options(suite="libero_goal", tasks="0", episodes=1, out=str(out))
    held = hold_output(out)
    try:
        with pytest.raises(SimEnvError, match="another bin/evaluate --sim is writing there now"):
            run_libero(str(tmp_path / "no-such-run"), opts, print)
    finally:
        os.close(held)
    fresh = tmp_path / "fresh" / "libero_goal"
    with pytest.raises(TargetError, match="no such directory"):
        run_libero(str(tmp_path / "no-such-run"), Options(suite="libero_goal", out=str(fresh)), print)
    assert not (tmp_path / "fresh").exists()


def _fake_checkpoint(root: Path, step: int) -> Path:
    path = root / f"checkpoint_step_{step}"
    path.mkdir(parents=True)
    (path / "train_state.json").write_text(json.dumps({"step": step}))
    files = {p.name: p.stat().st_size for p in path.iterdir()}
    (path / "COMPLETE").write_text(json.dumps({"step": step, "files": files}))
    return path


def test_the_target_is_resolved_once_and_the_folders_checkpoint_is_the_one_loaded(tmp_path, monkeypatch):
    """Issue 56 item 3: `best` moves (a run in training) right after bin/evaluate --sim resolved RUN_DIR:
    the checkpoint loaded is still the one the output folder is named after (it was resolved again in
    load_served, and one checkpoint's episodes landed in another's folder). The load is stopped there."""
    import trainer.sampling.load as loading
    from trainer.evaluation.cli import run_sim

    run = tmp_path / "run"
    first = _fake_checkpoint(run / "checkpoints", 5)
    _fake_checkpoint(run / "checkpoints", 7)
    (run / "checkpoints" / "best").symlink_to("checkpoint_step_5")
    real = loading.resolve_target
    calls = []

    def resolve_then_best_moves(target, verify=True):
        found = real(target, verify)
        calls.append(found)
        if len(calls) == 1:  # rank 0 points best at a newer checkpoint now
            os.replace(_relink(run / "checkpoints", "checkpoint_step_7"), run / "checkpoints" / "best")
        return found

    class Loaded(Exception):
        pass

    def load_model(target, cfg, full_scale=False, say=print, resolved=None, sources=None):
        raise Loaded((resolved or real(target))[1])

    monkeypatch.setattr(loading, "resolve_target", resolve_then_best_moves)
    monkeypatch.setattr(loading, "load_model", load_model)
    with pytest.raises(Loaded) as loaded:
        run_sim(str(run), "1", "libero_goal", "0", 800, 1, (), "libero", True, (), 0, "cpu", None)
    assert loaded.value.args[0].resolve() == first.resolve()
    assert calls[0] == ("checkpoint", first)
    assert not (run / "evaluation").exists()  # the refused command left no folder


def _relink(folder: Path, name: str) -> Path:
    tmp = folder / ".best.tmp"
    tmp.symlink_to(name)
    return tmp


def test_a_relative_and_an_absolute_target_are_one_checkpoint_in_settings(tmp_path, monkeypatch):
    """Issue 56 item 2: settings.json names the checkpoint by its resolved path: `runs/x` typed by a user
    and the absolute path the launcher passes continue the same episodes (each refused the other, exit 2,
    and the launcher's FAILED was final). load_served is stood in for (what it returns as the real one
    would name the checkpoint: as typed); what is tested is what the command stores."""
    import types

    import trainer.serving.session as session
    from trainer.evaluation.sim.command import Options, check_settings, load, settings_of
    from trainer.sampling.load import resolve_target
    from trainer.sim.suites import CAMERAS

    _fake_checkpoint(tmp_path / "runs" / "x" / "checkpoints", 4)
    spec = Spec(tuple(CAMERAS), 7, 2, 4)

    def load_served(target, config, cpu_scale, sets, device, seed, say, resolved=None):
        return types.SimpleNamespace(what=f"checkpoint {(resolved or resolve_target(target))[1]}", spec=spec)

    monkeypatch.setattr(session, "load_served", load_served)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs" / "x" / "evaluation" / "checkpoint_step_4" / "libero" / "libero_goal"
    opts = Options(suite="libero_goal", out=str(out))
    for target in ("runs/x", str(tmp_path / "runs" / "x"), "runs/x/checkpoints/checkpoint_step_4"):
        _, checkpoint, _ = load(target, opts, print)
        assert checkpoint == str(tmp_path / "runs" / "x" / "checkpoints" / "checkpoint_step_4")
        check_settings(out, settings_of(opts, checkpoint, "cpu", "libero 0"))  # the same settings: no refusal


def test_the_simulator_envs_identity_is_build_shs_hash_and_a_rerun_on_another_is_refused(tmp_path):
    """Issue 56 item 7: settings.json records the simulator env (the hash sim/build.sh keys its env with:
    its own formula, read from build.sh and run by bash, is compared); a lock change gives another identity,
    and a re-run in the same folder with another env is refused naming it (it mixed two simulators)."""
    import shutil
    import subprocess

    from trainer.evaluation.sim.command import Options, check_settings, settings_of
    from trainer.sim.env import REPO, env_identity

    def build_sh_hash(repo: Path) -> str:
        text = (REPO / "sim" / "build.sh").read_text()
        start = text.index("want=$(")
        formula = text[start : text.index("\n", text.index("sha256sum", start))]
        script = f'repo="{repo}"; spec="$repo/sim/libero"; machine=$(uname -m); {formula}; echo "$want"'
        return subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, check=True
        ).stdout.strip()

    assert env_identity("libero") == build_sh_hash(REPO)
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "sim", copy / "sim")
    (copy / "trainer" / "sim").mkdir(parents=True)
    shutil.copy(REPO / "trainer" / "sim" / "assets.py", copy / "trainer" / "sim" / "assets.py")
    assert build_sh_hash(copy) == build_sh_hash(REPO)
    with open(copy / "sim" / "libero" / "requirements.lock", "a") as lock:
        lock.write("# re-locked\n")
    assert build_sh_hash(copy) != build_sh_hash(REPO)  # the env a lock change builds is another one

    opts = Options(suite="libero_goal")
    out = tmp_path / "out"
    check_settings(out, settings_of(opts, "/ckpt", "cpu", f"libero {build_sh_hash(copy)}"))
    with pytest.raises(
        suites.UsageError,
        match=r"ran with sim_env 'libero [0-9a-f]{64}', not 'libero .*another simulator env",
    ):
        check_settings(out, settings_of(opts, "/ckpt", "cpu", f"libero {env_identity('libero')}"))
