"""A real, private, single-host Slurm (Debian's slurm-wlm 22.05 + munge) for the Slurm tests.

    cluster = SlurmCluster.start(root)     # installs the packages when absent (as root), or raises
    job = cluster.sbatch(script)           # the job id
    cluster.wait(job, lambda j: j["JobState"] == "COMPLETED", timeout=300)
    cluster.stop()                         # stops exactly the daemons it started

Contract:
- Everything lives under `root`: slurm.conf + gres.conf, the munge key and socket, state, spool, logs.
  Nothing of the host's own /etc/slurm or munge is used or touched; clients find this cluster through
  SLURM_CONF in `cluster.env` (and batch jobs inherit it, so `scontrol requeue` inside a job works).
- The daemons are started in the foreground as children of this process (munged -F, slurmctld -D,
  slurmd -D), each in its own session; stop() cancels the jobs still known to this cluster, waits for
  them to leave, then SIGTERMs (later SIGKILLs) exactly those PIDs.
- Readiness is observed, never assumed: `munge -n | unmunge` answers, then `sinfo` reports the node idle.
- SlurmUnavailable says why Slurm cannot run here (not root, packages not installable, a daemon that
  exits): the fixture turns it into a skip with that reason.

The slurm.conf is the one a small real cluster uses (select/cons_tres, proctrack/linuxproc, task/none:
cgroups are not usable in this sandbox), with these test choices:
- the node advertises `cpus` CPUs (more than the host has, SlurmdParameters=config_overrides) so several
  small jobs run at once;
- KillWait=60 (Slurm's default is 30): after a TERM, bin/train's save, the ranks' and torchrun's exit
  and the launcher's verdict took more than 30 s at load average 45 on this 2-core host, and slurmstepd
  SIGKILLed the launcher before its report;
- AuthInfo cred_expire=<requeue_delay_s>: Slurm holds a requeued job for the credential lifetime
  (Reason=BeginTime, 120 s by default); the tests shorten it rather than wait;
- a `gpu` GRES whose File= entries are placeholder files (there are no GPUs; slurmd 22.05 reports a
  File-less gpu GRES as count 0 and drains the node), so a script that asks for GPUs is schedulable;
- `pair_nodes=N` adds N more nodes on this same host, each its own slurmd (`slurmd -N <name>`, its own
  Port=, spool, pid and log file through %n), in partition PAIR_PARTITION: a job there gets
  `--nodes N` of them. Debian's 22.05 build runs several slurmd on one host this way (NodeHostname is
  this host for all of them). Their names (<host>-p1, ...) are not in DNS, so a job there needs its
  MASTER_ADDR set (127.0.0.1); the main node keeps the host's own name;
- `solo_nodes=N` adds N more such nodes (<host>-s1, ...), each alone in partition SOLO_PARTITION: a job
  whose teardown is meant to outlast KillWait runs there. While a job is COMPLETING on a node (here up to
  KillWait = 60 s), slurmctld 22.05 started no other job on that node: four scenarios requeued in that
  window each waited 28-42 s for it on the main node (measured in slurmctld.log);
- SchedulerParameters=bf_interval=1,sched_interval=5 (Slurm's defaults: 30 s and 60 s): a requeued job
  is pending until its hold ends, and nothing but the next scheduling pass starts it then; with the
  defaults that pass came 0-30 s later, a wait per requeued scenario; one backfill pass a second over 14
  jobs costs nothing;
- `first_job_id` (FirstJobId): bin/train derives torchrun's port from the job id (20000 + id % 20000),
  so two clusters that run at once (xdist workers) take job id ranges that do not meet; the ctld and
  slurmd ports are free ports picked at start.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge")
PAIR_PARTITION = "pair"
SOLO_PARTITION = "solo"
BINARIES = ("munged", "mungekey", "munge", "unmunge", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")
SBIN_DIRS = ("/usr/sbin", "/sbin")


class SlurmUnavailable(Exception):
    """Slurm cannot run on this machine; the message says why (a test skips with it)."""


def _which(name: str) -> str | None:
    path = os.environ.get("PATH", "") + os.pathsep + os.pathsep.join(SBIN_DIRS)
    return shutil.which(name, path=path)


def ensure_installed() -> None:
    """Install Debian's slurm-wlm and munge when a binary is missing (root only)."""
    missing = [b for b in BINARIES if _which(b) is None]
    if not missing:
        return
    if os.geteuid() != 0:
        raise SlurmUnavailable(f"Slurm is not installed ({', '.join(missing)} missing) and we are not root")
    if shutil.which("apt-get") is None:
        raise SlurmUnavailable(
            f"Slurm is not installed ({', '.join(missing)} missing) and there is no apt-get"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise SlurmUnavailable(f"{' '.join(command)} failed: {done.stderr.strip()[-400:]}")
    still = [b for b in BINARIES if _which(b) is None]
    if still:
        raise SlurmUnavailable(f"installed {' '.join(PACKAGES)} but {', '.join(still)} still missing")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_memory_mib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 4096


def pair_node_names(node: str, count: int) -> list[str]:
    return [f"{node}-p{i}" for i in range(1, count + 1)]


def solo_node_names(node: str, count: int) -> list[str]:
    return [f"{node}-s{i}" for i in range(1, count + 1)]


def extra_node_names(node: str, pair_nodes: int, solo_nodes: int) -> list[str]:
    return [*pair_node_names(node, pair_nodes), *solo_node_names(node, solo_nodes)]


def slurm_conf(
    root: Path,
    node: str,
    cpus: int,
    requeue_delay_s: int,
    gpus: int,
    pair_nodes: int = 0,
    first_job_id: int = 1,
    solo_nodes: int = 0,
) -> str:
    memory = max(1024, int(_node_memory_mib() * 0.8))
    ctld_port, slurmd_port = _free_port(), _free_port()
    pairs = [
        f"NodeName={name} NodeHostname={node} NodeAddr=127.0.0.1 Port={_free_port()} CPUs=4 "
        f"RealMemory={memory} State=UNKNOWN"
        for name in extra_node_names(node, pair_nodes, solo_nodes)
    ]
    for partition, names in ((PAIR_PARTITION, pair_node_names(node, pair_nodes)),
                             (SOLO_PARTITION, solo_node_names(node, solo_nodes))):  # fmt: skip
        if names:
            pairs.append(f"PartitionName={partition} Nodes={','.join(names)} MaxTime=INFINITE State=UP")
    return "\n".join(
        [
            "# Written by tests/support/slurm.py: a private single-host cluster for the Slurm tests.",
            "ClusterName=lingbottest",
            f"SlurmctldHost={node}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={root}/munge/munge.sock,cred_expire={requeue_delay_s}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={root}/state",
            f"SlurmdSpoolDir={root}/spool/%n",
            f"SlurmctldPidFile={root}/slurmctld.pid",
            f"SlurmdPidFile={root}/slurmd-%n.pid",
            f"SlurmctldLogFile={root}/slurmctld.log",
            f"SlurmdLogFile={root}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobRequeue=1",
            f"FirstJobId={first_job_id}",
            "MinJobAge=3600",
            "KillWait=60",  # 30 s by default; a test choice, see the module docstring
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            # a test choice, see the module docstring: a requeued job starts within ~1 s of its hold
            "SchedulerParameters=bf_interval=1,sched_interval=5",
            "MpiDefault=none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={root}/jobcomp.txt",
            "SlurmdParameters=config_overrides",
            "GresTypes=gpu",
            f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory} Gres=gpu:{gpus}"
            " State=UNKNOWN",
            f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP",
            *pairs,
            "",
        ]
    )


def parse_record(text: str) -> dict[str, str]:
    """`scontrol -o show job` / `show node`: KEY=VALUE fields on one line (values have no spaces, except
    a few at the end such as Command= and Reason= that we do not need whole)."""
    out: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key not in out:
            out[key] = value
    return out


@dataclass
class SlurmCluster:
    root: Path
    node: str
    env: dict[str, str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    # --- starting and stopping ------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        root: Path,
        *,
        cpus: int = 8,
        requeue_delay_s: int = 5,
        gpus: int = 2,
        pair_nodes: int = 0,
        first_job_id: int = 1,
        solo_nodes: int = 0,
    ) -> SlurmCluster:
        if os.geteuid() != 0:
            raise SlurmUnavailable("the Slurm daemons run as root here (SlurmUser=root) and we are not root")
        ensure_installed()
        root = root.absolute()
        for sub in ("munge", "state", "spool", "jobs", "gres"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        node = socket.gethostname().split(".")[0]
        extra = extra_node_names(node, pair_nodes, solo_nodes)
        for name in (node, *extra):
            (root / "spool" / name).mkdir(parents=True, exist_ok=True)
        conf = root / "slurm.conf"
        conf.write_text(
            slurm_conf(root, node, cpus, requeue_delay_s, gpus, pair_nodes, first_job_id, solo_nodes)
        )
        # slurmd 22.05 counts a gpu GRES by its File= entries (Count= alone reports 0 and drains the
        # node): placeholder files stand in for device nodes; with task/none nothing opens them.
        for i in range(gpus):
            (root / "gres" / f"gpu{i}").touch()
        (root / "gres.conf").write_text(f"NodeName={node} Name=gpu File={root}/gres/gpu[0-{gpus - 1}]\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(conf)
        env["PATH"] = os.pathsep.join([env.get("PATH", ""), *SBIN_DIRS])
        cluster = cls(root, node, env)
        try:
            cluster._start_munge()
            cluster._spawn("slurmctld", [_need("slurmctld"), "-D", "-i", "-f", str(conf)])
            cluster._spawn("slurmd", [_need("slurmd"), "-D", "-f", str(conf), "-N", node])
            for name in extra:
                cluster._spawn(f"slurmd:{name}", [_need("slurmd"), "-D", "-f", str(conf), "-N", name])
            cluster._wait_node_idle(timeout=90, count=1 + len(extra))
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start_munge(self) -> None:
        key, sock = self.root / "munge" / "munge.key", self.root / "munge" / "munge.sock"
        if not key.exists():
            made = subprocess.run(
                [_need("mungekey"), "--create", "--keyfile", str(key)], capture_output=True, text=True
            )
            if made.returncode != 0:
                raise SlurmUnavailable(f"mungekey --create failed: {made.stderr.strip()}")
        os.chmod(key, 0o600)
        os.chmod(self.root / "munge", 0o700)
        self._spawn(
            "munged",
            [
                _need("munged"), "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                f"--pid-file={self.root}/munge/munged.pid", f"--log-file={self.root}/munge/munged.log",
                f"--seed-file={self.root}/munge/munged.seed",
            ],
        )  # fmt: skip
        self._until(lambda: self._munge_ok(sock), 30, "munged to answer on its socket", "munged")

    def _munge_ok(self, sock: Path) -> bool:
        if not sock.exists():
            return False
        cred = subprocess.run([_need("munge"), "-n", f"--socket={sock}"], capture_output=True, timeout=10)
        if cred.returncode != 0:
            return False
        back = subprocess.run(
            [_need("unmunge"), f"--socket={sock}"], input=cred.stdout, capture_output=True, timeout=10
        )
        return back.returncode == 0 and b"Success" in back.stdout

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.stdout", "ab")
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        log.close()

    def _until(self, ready: Callable[[], bool], timeout: float, what: str, *daemons: str) -> None:
        """Poll `ready` (an observation of the daemons) until true; fail early if a daemon exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name in daemons or tuple(self.procs):
                rc = self.procs[name].poll()
                if rc is not None:
                    raise SlurmUnavailable(f"{name} exited {rc} while waiting for {what}: {self._tail(name)}")
            if ready():
                return
            time.sleep(0.2)  # polling an observable state with a deadline
        raise SlurmUnavailable(f"timed out after {timeout:.0f} s waiting for {what}: {self._tails()}")

    def _wait_node_idle(self, timeout: float, count: int = 1) -> None:
        def idle() -> bool:
            out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
            states = dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)
            return out.returncode == 0 and len(states) == count and set(states.values()) == {"idle"}

        self._until(idle, timeout, f"{count} node(s) ({self.node}...) to be idle in sinfo")

    def _tail(self, name: str) -> str:
        texts = []
        log = f"slurmd-{name.partition(':')[2] or self.node}" if name.startswith("slurmd") else name
        for path in (self.root / f"{name}.stdout", self.root / f"{log}.log"):
            if path.exists():
                texts.append(path.read_text(errors="replace")[-1500:])
        return " | ".join(texts)

    def _tails(self) -> str:
        return "; ".join(f"{n}: {self._tail(n)}" for n in self.procs)

    def stop(self) -> None:
        """Cancel what is left of the jobs, then stop exactly the daemons started here."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run(["scancel", "--full", "--quiet", "--user", "root"], check=False)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                left = self.run(["squeue", "-h", "-o", "%i %T"], check=False)
                if left.returncode != 0 or not left.stdout.strip():
                    break
                time.sleep(0.5)  # polling squeue with a deadline
        slurmds = [n for n in self.procs if n.startswith("slurmd")]
        for name in (*slurmds, "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)

    # --- using it -------------------------------------------------------------------------------------

    def run(self, argv: list[str], *, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
        return done

    def sbatch(self, script: Path, *options: str, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            ["sbatch", "--parsable", *options, str(script)],
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise AssertionError(f"sbatch {script} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        return parse_record(self.run(["scontrol", "-o", "show", "job", job_id]).stdout)

    def wait(
        self, job_id: str, condition: Callable[[dict[str, str]], bool], timeout: float, what: str = ""
    ) -> dict[str, str]:
        """Poll `scontrol show job` until `condition(job)` holds; the last record on timeout."""
        deadline = time.monotonic() + timeout
        record: dict[str, str] = {}
        while time.monotonic() < deadline:
            record = self.job(job_id)
            if condition(record):
                return record
            time.sleep(0.5)  # polling Slurm's own view with a deadline
        raise AssertionError(f"job {job_id}: timed out after {timeout:.0f} s waiting for {what}: {record}")

    def wait_done(self, job_id: str, timeout: float) -> dict[str, str]:
        final = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}
        return self.wait(job_id, lambda j: j.get("JobState") in final, timeout, "a final state")


def _need(name: str) -> str:
    path = _which(name)
    if path is None:
        raise SlurmUnavailable(f"{name} not found")
    return path
