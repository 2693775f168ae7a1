"""One attempt's outcome on this node, and on node 0 for every node: the verdict waits for every node.

Every launcher judges its torchrun (trainer/launcher/verdict.py). With several nodes:
- a node other than 0 writes what it decided to RUN_DIR/attempts/<id>/node<N>.outcome.json (status,
  reason, exit code, the stop signals it received, a note if its torchrun was killed) and exits;
- node 0, once its own torchrun has exited, waits for every other node's outcome before it writes the
  summary, says the result or requeues: its `completed` is never said while another node's launcher
  is still deciding. A node that reports nothing within NODE_WAIT_S (its launcher was killed) is named
  in a note; the outcome then rests on the rank records (every rank records its end before the last
  barrier). A node that reports failed makes the attempt failed, naming that node.
- the stop signals of every node count for the requeue rule (supervise.requeue_wanted): outside Slurm
  a stop signal to any one launcher stops every node (the stop request is in the shared attempt dir,
  and the ranks agree on it at their next step); under Slurm every node receives it (srun forwards a
  signal to every task of the step).

A stop before any rank started (supervise.Torchrun.stopped_before_ranks: torchrun starting, or waiting
in its rendezvous for a node that has not joined) is preempted, exit 75, with one line saying so.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from provision.atomic import write_json_atomic
from trainer.attempt import COMPLETED, EXIT_CODES, FAILED, PREEMPTED, Attempt, read_json
from trainer.launcher.console import say
from trainer.launcher.resolved import Launch
from trainer.launcher.verdict import Verdict, verdict

NODE_WAIT_S = 120.0  # after node 0's ranks are done: another node's ranks are past the last barrier too
NODE_WAIT_FAILED_S = 10.0  # after a failure: the others' reports only add detail (they may hang)


@dataclass
class NodeOutcome:
    node: int
    status: str
    exit_code: int
    reason: str | None = None
    signals: list[str] = field(default_factory=list)
    killed_note: str | None = None
    time: float = field(default_factory=time.time)


def outcome_path(attempt: Attempt, node: int) -> Path:
    return attempt.dir / f"node{node}.outcome.json"


def write_outcome(attempt: Attempt, outcome: NodeOutcome) -> None:
    try:
        write_json_atomic(outcome_path(attempt, outcome.node), asdict(outcome))
    except OSError as exc:
        say(f"could not write {outcome_path(attempt, outcome.node)} for node 0: {exc}")


def read_outcome(attempt: Attempt, node: int) -> NodeOutcome | None:
    data = read_json(outcome_path(attempt, node))
    if data is None:
        return None
    try:
        return NodeOutcome(**{k: v for k, v in data.items() if k in NodeOutcome.__dataclass_fields__})
    except TypeError:
        return None


def judge(launch: Launch, nproc: int, attempt: Attempt, torchrun: Any, rc: int) -> tuple[Verdict, list[str]]:
    """This node's verdict (node 0: of every node) and the stop signals every node received."""
    result = _own_verdict(launch, nproc, attempt, torchrun, rc)
    signals = list(torchrun.signals)
    nnodes, node = launch.rdzv.nnodes, launch.rdzv.node_rank
    if nnodes == 1:
        return result, signals
    if node != 0:
        from trainer.launcher.supervise import test_pause

        test_pause("verdict")  # test hook: hold this node's report (node 0 must wait for it)
        exit_code = EXIT_CODES[result.status] or 0
        write_outcome(
            attempt,
            NodeOutcome(node, result.status, exit_code, result.reason, signals, torchrun.killed_note),
        )
        return result, signals
    if torchrun.stopped_before_ranks:
        return result, signals  # no rank ran anywhere: another node may never have come
    wait_s = NODE_WAIT_FAILED_S if result.status == FAILED else NODE_WAIT_S
    others = wait_for_nodes(attempt, nnodes, wait_s)
    return _combine(result, others, nnodes), signals + [s for o in others.values() for s in o.signals]


def _own_verdict(launch: Launch, nproc: int, attempt: Attempt, torchrun: Any, rc: int) -> Verdict:
    if torchrun.stopped_before_ranks:
        waiting = (
            f"waited in its rendezvous for all {launch.rdzv.nnodes} nodes"
            if launch.rdzv.nnodes > 1
            else "was starting"
        )
        return Verdict(
            PREEMPTED,
            reason=f"received {torchrun.stopped_before_ranks} while torchrun {waiting}: no rank started, "
            "nothing was trained",
        )
    if getattr(torchrun, "no_rendezvous", None):  # one node's rendezvous never completed (supervise.py)
        return Verdict(FAILED, reason=torchrun.no_rendezvous)
    if getattr(torchrun, "lingered", None):  # every rank completed; torchrun did not exit (stall.py)
        return Verdict(COMPLETED, notes=[torchrun.lingered])
    if getattr(torchrun, "hung", None) is not None:  # the stall detector ended the attempt (stall.py)
        return Verdict(FAILED, reason=f"hung: {torchrun.hung.line}", hung=asdict(torchrun.hung))
    result = verdict(
        launch.world_size,
        nproc,
        attempt,
        launch.run_dir,
        rc,
        list(torchrun.stderr_tail),
        torchrun.record_lines,
        node_rank=launch.rdzv.node_rank,
    )
    if torchrun.killed_note and result.status == FAILED:
        # the ranks did not fail: torchrun itself was killed, and the launcher stopped them
        result.reason, result.failed_rank, result.rank_error = torchrun.killed_note, None, None
    if torchrun.signals and result.status == COMPLETED:
        result.notes.append(f"{', '.join(torchrun.signals)} arrived after the last step: the run is complete")
    return result


def wait_for_nodes(attempt: Attempt, nnodes: int, timeout: float) -> dict[int, NodeOutcome]:
    """The outcomes of nodes 1..nnodes-1, polled until all are there or `timeout` s have passed."""
    found: dict[int, NodeOutcome] = {}
    deadline = time.monotonic() + timeout
    said = False
    while True:
        for node in range(1, nnodes):
            if node not in found:
                outcome = read_outcome(attempt, node)
                if outcome is not None:
                    found[node] = outcome
        missing = [n for n in range(1, nnodes) if n not in found]
        if not missing or time.monotonic() >= deadline:
            return found
        if not said:
            names = ", ".join(map(str, missing))
            say(f"waiting for the launcher of node(s) {names} to report (up to {timeout:.0f} s)")
            said = True
        time.sleep(0.1)  # polling the other nodes' reports, with a deadline


def _combine(result: Verdict, others: dict[int, NodeOutcome], nnodes: int) -> Verdict:
    """Node 0's verdict with every other node's: a node that failed fails the attempt, named."""
    missing = [n for n in range(1, nnodes) if n not in others]
    if missing:
        result.notes.append(
            f"the launcher of node(s) {', '.join(map(str, missing))} did not report within the wait; "
            "the verdict rests on the rank records"
        )
    failed = [o for _, o in sorted(others.items()) if o.status == FAILED]
    if failed and result.status != FAILED:
        first = failed[0]
        return Verdict(FAILED, reason=f"node {first.node}: {first.reason}", notes=result.notes)
    killed = [o for _, o in sorted(others.items()) if o.killed_note]
    if killed and result.status == FAILED:
        # the ranks did not fail: another node's torchrun was killed, and its launcher stopped them
        result.reason = f"node {killed[0].node}: {killed[0].killed_note}"
        result.failed_rank, result.rank_error = None, None
    return result
