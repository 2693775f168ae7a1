"""`bin/train --nnodes 2` as two launchers on this machine (node ranks 0 and 1, one rank each, a local
rendezvous endpoint, one shared run dir): completion, a stop signal, the resume, and what the verdict
waits for. Also: a stop while a launcher waits in the rendezvous for a node that never comes.

Every launcher is `python -m trainer.launcher` (what bin/train execs) with a tiny model and --env-checked
(the compile checks are test_envcheck's). Synchronisation is by observation with deadlines, never by
sleeps: LINGBOT_TEST_PAUSE_AT parks rank 0 at a step (or node 1's launcher before its report), the test
acts, then releases it.

The signal rule for several nodes (trainer/launcher/nodes.py): under Slurm every node's launcher gets a
stop signal (srun forwards it to every task of the step); outside Slurm a signal to any one launcher
stops every node, through the stop request in the shared attempt dir. The test signals node 1 only.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.support.runs import REPO, STEPS, clean_env, losses_by_step, pause_env, set_args, summary, tiny

TINY = tiny(keep=3, tensorboard=False)
# A deadline, not a duration: a tiny run takes ~1 min on a quiet host; it has to hold at load average 35-45.
TIMEOUT = 600
# A stop in the rendezvous: the launcher says so within PROMPT_S and has exited within EXIT_S (torchrun's
# join timeout is 600 s). The exit includes the interpreter's teardown of torch: ~1 s of CPU, 8-10 s on
# this 2-core host at load average 15-20.
PROMPT_S = 10
EXIT_S = 60

pytestmark = [pytest.mark.heavy, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def base_env(tmp_path_factory) -> dict[str, str]:
    return clean_env(tmp_path_factory.mktemp("no-envs"))  # no provisioned env: the tool env


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("episodes") / "furniture"


@dataclass
class Launcher:
    node: int
    proc: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def finish(self, timeout: float = TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"node {self.node}'s launcher still running after {timeout} s:\n{self.output()}"
            ) from None


def start(node: int, run_dir: Path, data_dir: Path, env: dict, port: int, attempt: str, **extra) -> Launcher:
    argv = [sys.executable, "-m", "trainer.launcher", "furniture_train", "1", "--cpu-scale", "--env-checked"]
    argv += ["--run-dir", str(run_dir), "--nnodes", "2", "--node-rank", str(node)]
    argv += ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    argv += set_args([*TINY, f"data.path={data_dir}"])
    log = run_dir.parent / f"{run_dir.name}-{attempt}-node{node}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env={**env, "LINGBOT_ATTEMPT_ID": attempt, **extra},
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return Launcher(node, proc, log)


def until(condition, what: str, *launchers: Launcher, timeout: float = TIMEOUT) -> None:
    """Poll `condition` with a deadline; fail early if a launcher exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        for launcher in launchers:
            if launcher.proc.poll() is not None:
                rc = launcher.proc.returncode
                raise AssertionError(f"node {launcher.node} exited {rc} before {what}:\n{launcher.output()}")
        time.sleep(0.05)  # polling for an event, with a deadline: not a sleep standing in for one
    raise AssertionError(f"timed out waiting for {what}:\n" + "\n".join(x.output() for x in launchers))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir, base_env) -> dict:
    """An uninterrupted two-node run, with node 1's launcher held before its report: node 0's launcher
    must not say completed (nor exit) while node 1 has not reported."""
    root = tmp_path_factory.mktemp("reference")
    run_dir, pause = root / "run", root / "pause"
    port = free_port()
    node0 = start(0, run_dir, data_dir, base_env, port, "ref")
    node1 = start(1, run_dir, data_dir, base_env, port, "ref", **pause_env(pause, "verdict:0"))
    until(lambda: (pause / "reached").exists(), "node 1's launcher to reach its report", node0, node1)
    until(lambda: "waiting for the launcher of node(s) 1" in node0.output(), "node 0 to wait", node0)
    assert node0.proc.poll() is None and "[bin/train] completed" not in node0.output(), node0.output()
    (pause / "release").touch()
    assert node1.finish() == 0, node1.output()
    assert node0.finish() == 0, node0.output()
    out0 = node0.output()
    assert out0.index("waiting for the launcher of node(s) 1") < out0.index("[bin/train] completed"), out0
    node1_report = json.loads((run_dir / "attempts" / "ref" / "node1.outcome.json").read_text())
    assert node1_report["status"] == "completed" and node1_report["exit_code"] == 0, node1_report
    result = summary(run_dir)
    assert result["status"] == "completed" and result["nnodes"] == 2 and result["world_size"] == 2, result
    losses = losses_by_step(run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1)), losses
    return losses


def test_two_launchers_complete_and_node_0_waits_for_node_1(reference):
    assert sorted(reference) == list(range(1, STEPS + 1))


def test_a_stop_to_one_launcher_saves_on_both_and_a_rerun_resumes_bitwise(
    tmp_path, data_dir, base_env, reference
):
    run_dir, pause = tmp_path / "run", tmp_path / "pause"
    port = free_port()
    extra = pause_env(pause, "step:3")  # global rank 0 (node 0) parks at step 3
    node0 = start(0, run_dir, data_dir, base_env, port, "a1", **extra)
    node1 = start(1, run_dir, data_dir, base_env, port, "a1", **extra)
    until(lambda: (pause / "reached").exists(), "rank 0 to pause at step 3", node0, node1)
    node1.proc.send_signal(signal.SIGUSR1)  # node 1 only: the stop request reaches node 0's rank too
    stop = run_dir / "attempts" / "a1" / "stop"
    until(stop.exists, "node 1's stop request", node0, node1)
    (pause / "release").touch()
    assert node1.finish() == 75, node1.output()
    assert node0.finish() == 75, node0.output()
    assert "received SIGUSR1" in node1.output(), node1.output()
    for launcher in (node0, node1):  # node 0's torchrun hosts the store and leaves last (issue 19 item 3)
        for crash in ("Traceback", "TCPStore", "exit barrier"):
            assert crash not in launcher.output(), launcher.output()
    stopped = summary(run_dir)
    assert stopped["status"] == "preempted" and stopped["last_complete_checkpoint"]["step"] == 3, stopped
    assert "stopping at step 3 " in node0.output(), node0.output()

    port = free_port()
    again = [start(n, run_dir, data_dir, base_env, port, "a2") for n in (0, 1)]
    assert [x.finish() for x in again] == [0, 0], [x.output() for x in again]
    result = summary(run_dir)
    assert result["status"] == "completed" and result["resumed_from"] == 3, result
    assert losses_by_step(run_dir) == reference  # bitwise: the uninterrupted two-node run's losses


def listening(pid: int, port: int) -> bool:
    try:
        return any(
            c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
            for c in psutil.Process(pid).net_connections(kind="tcp")
        )
    except psutil.Error:
        return False


def torchrun_of(launcher: Launcher) -> psutil.Process | None:
    try:
        children = psutil.Process(launcher.proc.pid).children()
    except psutil.Error:
        return None
    return next((c for c in children if "torch.distributed.run" in " ".join(c.cmdline())), None)


@pytest.mark.parametrize("node,sig", [(0, signal.SIGUSR1), (1, signal.SIGTERM)])
def test_a_stop_while_waiting_in_the_rendezvous_acts_at_once(tmp_path, data_dir, base_env, node, sig):
    """One launcher of --nnodes 2 without the other: it waits in torchrun's rendezvous (node 0 holds the
    store; node 1 keeps trying to reach it). A stop signal ends the wait at once: exit 75, one line."""
    run_dir, port = tmp_path / "run", free_port()
    alone = start(node, run_dir, data_dir, base_env, port, "lonely")
    if node == 0:  # torchrun serves the rendezvous store and waits for node 1

        def serving() -> bool:
            torchrun = torchrun_of(alone)
            return torchrun is not None and listening(torchrun.pid, port)

        until(serving, "torchrun to serve the rendezvous", alone)
    else:  # torchrun is up and retrying node 0's address
        until(lambda: torchrun_of(alone) is not None, "torchrun to start", alone)
    torchrun = torchrun_of(alone)
    assert torchrun is not None
    signalled = time.monotonic()
    alone.proc.send_signal(sig)
    said = None
    while said is None and time.monotonic() - signalled < EXIT_S:
        if "[bin/train] preempted (" in alone.output():
            said = time.monotonic() - signalled
        elif alone.proc.poll() is not None:
            break
        time.sleep(0.02)  # polling the launcher's output, with a deadline
    rc = alone.finish(timeout=EXIT_S)
    took = time.monotonic() - signalled
    out = alone.output()
    assert rc == 75, out
    assert said is not None and said < PROMPT_S, (said, out)
    assert not torchrun.is_running() or torchrun.status() == psutil.STATUS_ZOMBIE, out
    assert "Traceback" not in out and "SignalException" not in out, out
    lines = [line for line in out.splitlines() if f"received {sig.name}" in line]
    assert len(lines) == 1, out
    assert "while torchrun waited in its rendezvous for all 2 nodes: no rank started" in lines[0], out
    assert "exit 75" in lines[0], out
    if node == 0:
        result = summary(run_dir)
        assert result["status"] == "preempted" and result["exit_code"] == 75, result
        assert "rendezvous" in result["reason"], result
    print(
        f"\nrendezvous stop, node {node}, {sig.name}: said {said:.1f} s, exited {took:.1f} s after the signal"
    )
