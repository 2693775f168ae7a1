"""The LIBERO evaluation's results: counted from the episode records on disk, written as JSON and a PNG.

    result = summarise(out, suite, checkpoint, tasks, episodes, errors, seconds)
    write_results(out, result)          # OUT/results.json (atomic) and OUT/success.png (success per task)
    Progress(total, done_before, say)   # the terminal's bar with ETA (a line per episode when not a tty)

Counting: an episode counts when its record (OUT/episodes/t<task>_e<episode>.json, written by the worker
after its video) exists, whichever run wrote it; a success is the record's `success`, LIBERO's own `done`.
Errors (a crashed worker) are this run's and count neither way: `episodes` is the number of episodes with
a record, `success_rate` = successes / episodes (null when none), and `errors` lists what failed to run.
A failure's record says why (`reason`: the step limit, or a chunk the server refused as not finite): an
unsolved episode is always a failure, never an error (worker.py).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from provision.atomic import write_json_atomic


def record_path(out: Path, task: int, episode: int) -> Path:
    return out / "episodes" / f"t{task:02d}_e{episode:03d}.json"


def load_records(out: Path, tasks: list[int], episodes: int) -> dict[tuple[int, int], dict]:
    found = {}
    for t in tasks:
        for e in range(episodes):
            path = record_path(out, t, e)
            if path.is_file():
                found[(t, e)] = read_json_or_refuse(path, "remove it and the re-run plays that episode again")
    return found


def read_json_or_refuse(path: Path, fix: str) -> Any:
    """An output file this command wrote (atomically) and reads back; damaged (a disk fault, a hand edit):
    suites.UsageError naming it and `fix`, never a JSONDecodeError traceback."""
    from trainer.sim import suites

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise suites.UsageError(f"{path}: unreadable ({exc}); {fix}: rm {path}") from None


def summarise(out: Path, suite: str, checkpoint: str, tasks: list[int], episodes: int, errors: list[dict],
              seconds: float, languages: dict[int, str]) -> dict:  # fmt: skip
    records = load_records(out, tasks, episodes)
    rows: list[dict[str, Any]] = []
    for t in tasks:
        mine = [r for (task, _), r in sorted(records.items()) if task == t]
        lang = next((r["language"] for r in mine), languages.get(t, ""))
        wins = sum(1 for r in mine if r["success"])
        rows.append({"task": t, "language": lang, "episodes": len(mine), "successes": wins,
                     "rate": wins / len(mine) if mine else None})  # fmt: skip
    n = sum(r["episodes"] for r in rows)
    wins = sum(r["successes"] for r in rows)
    timing: dict[str, float] = {}
    for r in records.values():
        for k, v in r.get("timing", {}).items():
            timing[k] = timing.get(k, 0.0) + v
    return {
        "suite": suite, "checkpoint": checkpoint, "success_rate": wins / n if n else None, "episodes": n,
        "successes": wins, "seconds": round(seconds, 1), "tasks": rows, "errors": errors,
        "requested": len(tasks) * episodes, "missing": len(tasks) * episodes - n,
        "episode_seconds": {k: round(v, 2) for k, v in sorted(timing.items())}, "out": str(out),
    }  # fmt: skip


def write_results(out: Path, result: dict) -> None:
    write_json_atomic(out / "results.json", result)
    plot(out / "success.png", result)


def plot(path: Path, result: dict) -> None:
    import os
    import tempfile

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["tasks"]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.5))
    labels = [f"{r['task']}: {r['language'][:48]} ({r['successes']}/{r['episodes']})" for r in rows]
    ax.barh(range(len(rows)), [r["rate"] or 0.0 for r in rows], color="tab:green")
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("success rate")
    rate = result["success_rate"]
    share = "-" if rate is None else f"{rate:.0%}"
    name = Path(result["checkpoint"]).name
    title = f"{result['suite']}: {result['successes']}/{result['episodes']} ({share}) {name}"
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(prefix=".success.", suffix=".png", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp's 0600: teammates on a shared filesystem could not open it
    try:
        fig.savefig(tmp)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)


def _clock(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Progress:
    """`libero_10 [#####.....] 12/500 episodes, 3 success, 0 error | 0:05:01 elapsed, ETA 3:20:00`."""

    def __init__(
        self, suite: str, total: int, before: int, say: Callable[[str], None], tty: bool | None = None
    ):
        self.suite, self.total, self.before, self.say = suite, total, before, say
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.start, self.done, self.wins, self.errors = time.monotonic(), 0, 0, 0

    def line(self) -> str:
        finished = self.before + self.done + self.errors
        elapsed = time.monotonic() - self.start
        ran = self.done + self.errors
        eta = _clock(elapsed / ran * (self.total - finished)) if ran else "-"
        bar = "#" * int(20 * finished / max(1, self.total))
        return (f"{self.suite} [{bar:<20}] {finished}/{self.total} episodes, {self.wins} success, "
                f"{self.errors} error | {_clock(elapsed)} elapsed, ETA {eta}")  # fmt: skip

    def update(self, record: dict) -> None:
        if "error" in record:
            self.errors += 1
        else:
            self.done += 1
            self.wins += bool(record["success"])
        if self.tty:
            print("\r" + self.line(), end="", file=sys.stderr, flush=True)
        else:
            failure = f"failure ({record['reason']})" if record.get("reason") else "failure"
            what = record.get("error") or ("success" if record["success"] else failure)
            self.say(f"evaluate: task {record['task']} episode {record['episode']}: {what} | {self.line()}")

    def close(self) -> None:
        if self.tty:
            print(file=sys.stderr, flush=True)
