"""One observer of a test cluster's jobs for many scenario threads: one `scontrol -o show job` per interval.

    watch = JobWatch(cluster, interval=0.5)    # starts polling at once (a daemon thread)
    record = watch.job(job_id)                 # its newest record, from a query newer than the call
    record = watch.latest(job_id)              # its newest record there is, without waiting
    watch.states(job_id)                       # every JobState seen for it so far
    watch.stop()

Why: tests/test_slurm.py drives 14 jobs at once, each with its own thread; when every thread ran its
own `scontrol show job <id>` every 0.2-0.5 s, the cluster answered tens of queries a second (a process
start, a munge credential and a slurmctld RPC each) on a 2-core host. One query for all jobs gives every
job the same sampling of its states for a fourteenth of the queries. Each query is a fork/exec of
scontrol (~8 ms of CPU, estimated; at 0.2 s about half the pytest worker's CPU in test_slurm):
test_slurm asks every 0.5 s and paces its waits for files (a pause point reached, a stop file, a log
line) with a local sleep and `latest()`, so only a wait for a Slurm state waits for a query.

Contract: the record of a job is the one line of the last successful query that names it (a failed or
timed-out query keeps the previous records and the next interval asks again; a driver that stops seeing
progress still fails on its own deadline);
`states` accumulates every JobState of every successful query, so a state that lasts one interval is
seen. `job()` waits for one query newer than the call (at most `fresh_s`), so a record read right after
acting on the job (a signal, a release) is never older than the action; `latest()` never waits (its record
may be up to one interval plus a query old: enough to see that a job ended while waiting for a file).
"""

from __future__ import annotations

import subprocess
import threading

from tests.support.slurm import SlurmCluster, parse_record


class JobWatch:
    def __init__(self, cluster: SlurmCluster, interval: float = 0.5, fresh_s: float = 30) -> None:
        self.cluster = cluster
        self.interval = interval
        self.fresh_s = fresh_s
        self._records: dict[str, dict[str, str]] = {}
        self._states: dict[str, set[str]] = {}
        self._started = 0  # queries started
        self._generation = 0  # the number of the last query that ended
        self._cond = threading.Condition()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slurm-job-watch", daemon=True)
        self._thread.start()

    def _query(self) -> None:
        with self._cond:
            self._started += 1
            number = self._started
        try:
            done = self.cluster.run(["scontrol", "-o", "show", "job"], check=False)
        except subprocess.TimeoutExpired:  # a stuck query: the next interval asks again
            done = None
        with self._cond:
            if done is not None and done.returncode == 0:
                for line in done.stdout.splitlines():
                    record = parse_record(line)
                    job = record.get("JobId")
                    if job:
                        self._records[job] = record
                        self._states.setdefault(job, set()).add(record.get("JobState", "?"))
            self._generation = number
            self._cond.notify_all()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._query()
            self._stopped.wait(self.interval)  # the polling interval (an Event: stop() ends it at once)

    def job(self, job_id: str) -> dict[str, str]:
        """The newest record of `job_id`, from a query that started after this call."""
        with self._cond:
            wanted = self._started + 1  # the next query to start: it starts after this call
            self._cond.wait_for(lambda: self._generation >= wanted, timeout=self.fresh_s)
            return dict(self._records.get(job_id, {}))

    def latest(self, job_id: str) -> dict[str, str]:
        """The newest record of `job_id` there is ({} until first seen), without waiting for a query."""
        with self._cond:
            return dict(self._records.get(job_id, {}))

    def states(self, job_id: str) -> set[str]:
        with self._cond:
            return set(self._states.get(job_id, set()))

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=60)


__all__ = ["JobWatch"]
