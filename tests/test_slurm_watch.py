"""tests/support/slurm_watch.py without a cluster: a stand-in answers `scontrol -o show job` from a script
of states, so what the shared observer promises (fresh records, every state kept, one query for all
jobs, a `latest()` that never waits) is checked in milliseconds."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from tests.support.slurm_watch import JobWatch

pytestmark = pytest.mark.fast


class FakeCluster:
    """Answers each query with the next of `answers` (the last one repeats); counts the queries."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = answers
        self.queries = 0
        self.argvs: list[list[str]] = []
        self.lock = threading.Lock()

    def run(self, argv: list[str], *, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        with self.lock:
            self.argvs.append(argv)
            text = self.answers[min(self.queries, len(self.answers) - 1)]
            self.queries += 1
        if text == "ERROR":
            return subprocess.CompletedProcess(argv, 1, "", "slurm_load_jobs error")
        return subprocess.CompletedProcess(argv, 0, text, "")


def line(job: str, state: str, restarts: int = 0) -> str:
    return f"JobId={job} JobName=lingbot JobState={state} Restarts={restarts} ExitCode=0:0 Command=/x y\n"


def test_every_state_is_kept_and_a_failed_query_keeps_the_last_records():
    answers = [
        "No jobs in the system\n",
        line("1", "PENDING") + line("2", "RUNNING"),
        line("1", "RUNNING") + line("2", "FAILED"),
        "ERROR",
        line("1", "COMPLETED", restarts=1) + line("2", "FAILED"),
    ]
    cluster = FakeCluster(answers)
    watch = JobWatch(cluster, interval=0.001)  # type: ignore[arg-type]
    try:
        for _ in range(1000):  # each call waits for a newer query: the last answer comes on the 5th
            if watch.job("1").get("JobState") == "COMPLETED":
                break
        assert watch.job("1")["Restarts"] == "1"
        assert watch.states("1") == {"PENDING", "RUNNING", "COMPLETED"}
        assert watch.states("2") == {"RUNNING", "FAILED"} and watch.job("2")["JobState"] == "FAILED"
        assert watch.job("3") == {} and watch.states("3") == set()
    finally:
        watch.stop()
    assert all(argv == ["scontrol", "-o", "show", "job"] for argv in cluster.argvs)  # one query, all jobs


def test_a_record_comes_from_a_query_started_after_the_call():
    cluster = FakeCluster([line("7", "RUNNING")])
    watch = JobWatch(cluster, interval=0.001)  # type: ignore[arg-type]
    try:
        watch.job("7")
        with cluster.lock:  # the job changes right after a read ...
            cluster.answers, cluster.queries = [line("7", "COMPLETED")], 0
        assert watch.job("7")["JobState"] == "COMPLETED"  # ... and the next read sees it, never a stale one
    finally:
        watch.stop()


def test_latest_never_waits_for_a_query():
    cluster = FakeCluster([line("9", "RUNNING")])
    # one query at the start, then none for an hour: job() would wait for one (up to fresh_s), latest() not
    watch = JobWatch(cluster, interval=3600, fresh_s=0.3)  # type: ignore[arg-type]
    try:
        deadline = time.monotonic() + 30
        while not watch.latest("9") and time.monotonic() < deadline:
            time.sleep(0.001)  # polling for the first query's end, with a deadline
        started = time.monotonic()
        assert watch.latest("9")["JobState"] == "RUNNING" and watch.latest("10") == {}
        assert time.monotonic() - started < 0.1, "latest() waited for a query"
        started = time.monotonic()
        assert watch.job("9")["JobState"] == "RUNNING"  # no newer query came: the last record, after fresh_s
        assert time.monotonic() - started >= 0.3
        assert cluster.queries == 1
    finally:
        watch.stop()
