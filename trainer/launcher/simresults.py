"""Where a simulator evaluation's result goes (simeval.py's Publisher): the record, the metrics, the best.

    record = make_record(step, status, started, result, reason, exit_code, log)
    pub = Publisher(cfg, run_dir); pub.publish(record); pub.close()
    sim_summary(cfg, run_dir)       # summary.json's `sim` (write_final_summary), None with eval.sim none

publish, in this order: RUN_DIR/evaluation/sim.json (trainer/checkpoint/simrecords.py, atomic); for a
`done` record a line `{"record": "sim", "step": N, "sim/success_rate": r, "sim/episodes": n,
"sim/successes": k, "sim/seconds": s, "sim/results": path}` appended to RUN_DIR/metrics.jsonl (one
O_APPEND write of the whole line, so rank 0's lines, written the same way, never interleave with it; a
reader keyed by step tells the two apart by `record`), and `sim/success_rate` (also sim/episodes) at step
N in RUN_DIR/tensorboard/ through an event file of the launcher's own (suffix .sim; the launcher does not
import torch: tensorboard's EventFileWriter); with eval.best_by sim, RUN_DIR/checkpoints/best re-pointed
atomically (best.py point; rank 0 computes the same at its next save). A write that fails is said in one
line; the record on disk stays the truth.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from trainer.checkpoint import simrecords
from trainer.checkpoint.best import SIM, best_by_of, best_json, find_best, point
from trainer.checkpoint.layout import scan
from trainer.launcher.console import say


def read_results(out: Path) -> dict[str, Any] | None:
    """OUT/results.json (bin/evaluate writes it whole, atomically), or None."""
    try:
        data = json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def make_record(step: int, status: str, started: float | None, result: dict | None, reason: str | None,
                exit_code: int | None, log: Path | None) -> dict[str, Any]:  # fmt: skip
    now = time.time()
    done = status == simrecords.DONE and result is not None
    return {
        "step": step, "status": status, "success_rate": (result or {}).get("success_rate") if done else None,
        "episodes": (result or {}).get("episodes"), "successes": (result or {}).get("successes"),
        "requested": (result or {}).get("requested"),
        "results": str(Path(result["out"]) / "results.json") if result and result.get("out") else None,
        "started": started, "finished": now, "seconds": round(now - started, 1) if started else None,
        "exit_code": exit_code, "log": str(log) if log else None, "reason": reason,
    }  # fmt: skip


class Publisher:
    def __init__(self, cfg: Any, run_dir: Path):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.root = self.run_dir / "checkpoints"
        self.writer: Any = None

    def publish(self, record: dict[str, Any]) -> None:
        simrecords.write_record(self.root, record)
        step, status = record["step"], record["status"]
        if status != simrecords.DONE or record["success_rate"] is None:
            say(f"sim: step {step}: {status}" + (f": {record['reason']}" if record.get("reason") else ""))
            return
        rate = record["success_rate"]
        say(f"sim: step {step}: success rate {rate:.1%} ({record['successes']}/{record['episodes']} "
            f"episodes, {record['seconds']} s); results {record['results']}")  # fmt: skip
        self._metrics_line(record)
        self._tensorboard(step, {"sim/success_rate": rate, "sim/episodes": float(record["episodes"])})
        if best_by_of(self.cfg) == SIM:
            found = find_best(scan(self.root)[0], SIM)
            point(self.root, found[0] if found else None)

    def _metrics_line(self, record: dict[str, Any]) -> None:
        line = {"record": "sim", "step": record["step"], "sim/success_rate": record["success_rate"],
                "sim/episodes": record["episodes"], "sim/successes": record["successes"],
                "sim/seconds": record["seconds"], "sim/results": record["results"]}  # fmt: skip
        try:
            fd = os.open(self.run_dir / "metrics.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps(line) + "\n").encode())
            finally:
                os.close(fd)
        except OSError as exc:
            say(f"sim: could not append to {self.run_dir / 'metrics.jsonl'}: {exc}")

    def _tensorboard(self, step: int, values: dict[str, float]) -> None:
        if not self.cfg.log.tensorboard:
            return
        try:
            from tensorboard.compat.proto import event_pb2, summary_pb2
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            if self.writer is None:
                self.writer = EventFileWriter(str(self.run_dir / "tensorboard"), filename_suffix=".sim")
            summary = summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in values.items()]
            )
            self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
            self.writer.flush()
        except (ImportError, OSError) as exc:
            say(f"sim: no TensorBoard event for step {step}: {exc}")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def sim_summary(cfg: Any, run_dir: Path) -> dict[str, Any] | None:
    """summary.json's `sim`: the settings, every evaluation by step, and the best by success rate."""
    ev = cfg.eval
    if ev.sim == "none":
        return None
    root = Path(run_dir) / "checkpoints"
    records = simrecords.read_records(root)
    return {
        "sim": ev.sim, "suite": ev.sim_suite, "every": ev.sim_every, "tasks": ev.sim_tasks,
        "episodes_per_task": ev.sim_episodes, "max_steps": ev.sim_max_steps,
        "evaluations": [records[k] for k in sorted(records)],
        "best": best_json(root, scan(root)[0], SIM),
    }  # fmt: skip
