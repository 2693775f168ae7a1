"""Real compiles and interpreter facts, each in a fresh subprocess with throwaway caches.

A probe is a Python program in provision/probes/scripts/ (real files, linted like the rest), run by
the env's python (or the tool python when the env has none) in the job's environment, with
scripts/common.py beside it as `envcheck_probe_common`. It prints one line ``ENVCHECK_RESULT=<json>``. The
caches it could read are all throwaway and empty when it starts: TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR
and TMPDIR (Inductor keeps precompiled headers under ``$TMPDIR/torchinductor_$USER`` whatever
TORCHINDUCTOR_CACHE_DIR says), so a warm cache can never stand in for a missing compiler. By default
all three are the probe's own (`throwaway_caches`), removed when it ends. A caller may instead pass
`shared` (`shared_scratch`): TORCHINDUCTOR_CACHE_DIR and TMPDIR made empty by that caller for one
envcheck run, used by its probes one after another (envcheck: the Inductor probe, then CPU
FlexAttention, which reuses the ISA probe and precompiled header the first one built), removed by that
caller; TRITON_CACHE_DIR is always the probe's own.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

RESULT_MARKER = "ENVCHECK_RESULT="
SCRIPTS = Path(__file__).resolve().parent / "scripts"
COMMON_MODULE = "envcheck_probe_common"  # scripts/common.py, copied beside every probe as this name
NAMES = ("triton_build", "inductor_cpp", "flex_attention", "cpp_extension", "interpreter")
SHAREABLE = ("TORCHINDUCTOR_CACHE_DIR", "TMPDIR")  # what `shared` may replace; never TRITON_CACHE_DIR


def script(name: str) -> str:
    """The text of the probe program `name` (provision/probes/scripts/<name>.py)."""
    if name not in NAMES:
        raise KeyError(f"no probe {name!r} (probes: {', '.join(NAMES)})")
    return (SCRIPTS / f"{name}.py").read_text()


@dataclass
class ProbeRun:
    """One probe's outcome: `result` is its JSON (empty if it printed none), `seconds` its wall time."""

    name: str
    returncode: int | None
    result: dict
    seconds: float
    stdout: str
    stderr: str
    timed_out: bool = False
    caches: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.result.get("ok")) and self.returncode == 0

    def failure_text(self) -> str:
        """The error as reported by the probe, else the tail of what the process printed."""
        if self.timed_out:
            return f"timed out after {self.seconds:.0f} s"
        if self.result.get("error"):
            return str(self.result["error"])
        tail = "\n".join((self.stderr or self.stdout).strip().splitlines()[-6:])
        return tail or f"exit status {self.returncode} and no output"


def throwaway_caches(scratch: Path) -> dict[str, str]:
    """Fresh, empty cache locations under `scratch`, including a private TMPDIR."""
    caches = {
        "TRITON_CACHE_DIR": scratch / "triton",
        "TORCHINDUCTOR_CACHE_DIR": scratch / "inductor",
        "TMPDIR": scratch / "tmp",
    }
    for path in caches.values():
        path.mkdir(parents=True)
    return {name: str(path) for name, path in caches.items()}


def shared_scratch(root: Path) -> dict[str, str]:
    """Fresh, empty TORCHINDUCTOR_CACHE_DIR and TMPDIR under `root` (an empty directory its caller made
    and removes), for `run_probe(shared=...)`: probes run one after another reuse what the first built."""
    dirs = {"TORCHINDUCTOR_CACHE_DIR": root / "inductor", "TMPDIR": root / "tmp"}
    for path in dirs.values():
        path.mkdir(parents=True)
    return {name: str(path) for name, path in dirs.items()}


def run_probe(
    name: str,
    script: str,
    python: str,
    env: Mapping[str, str],
    *,
    args: dict | None = None,
    timeout: float = 300,
    progress: Callable[[str], None] | None = None,
    heartbeat_s: float = 10.0,
    shared: Mapping[str, str] | None = None,
    activity: str = "still compiling",
) -> ProbeRun:
    """Run `script` with `python` in `env` plus throwaway caches; the scratch dir is removed after.

    `shared` (from `shared_scratch`; keys from SHAREABLE only) replaces the probe's own
    TORCHINDUCTOR_CACHE_DIR and TMPDIR; those dirs outlive the probe (their caller removes them).
    `progress` gets a line every `heartbeat_s` while the probe runs (the slow compiles), "NAME: ACTIVITY
    (N s)"."""
    unknown = sorted(set(shared or {}) - set(SHAREABLE))
    if unknown:
        raise ValueError(f"run_probe: {', '.join(unknown)} cannot be shared (only {', '.join(SHAREABLE)})")
    scratch = Path(tempfile.mkdtemp(prefix=f"envcheck-{name}-"))
    try:
        caches = {**throwaway_caches(scratch), **(shared or {})}
        script_path = scratch / f"envcheck_probe_{name}.py"  # never shadows a module
        script_path.write_text(script)
        shutil.copyfile(SCRIPTS / "common.py", scratch / f"{COMMON_MODULE}.py")
        argv: Sequence[str] = [python, str(script_path), json.dumps(args or {})]
        start = time.perf_counter()
        if _STOPPING.is_set():
            return ProbeRun(name, None, {"ok": False, "error": "not run: envcheck was stopped"}, 0.0, "", "")
        try:
            proc = subprocess.Popen(
                argv,
                env={**env, **caches},
                cwd=scratch,  # never import the caller's working tree by accident
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,  # its own process group: a timeout kills Inductor's workers too
            )
        except OSError as exc:
            return ProbeRun(name, None, {"ok": False, "error": f"cannot run {python}: {exc}"}, 0.0, "", "")
        with _LIVE_LOCK:
            _LIVE.add(proc)
        if _STOPPING.is_set():  # stop_all ran between the check above and the registration
            _kill_group(proc)
        try:
            stdout, stderr, timed_out = _communicate(
                proc, timeout, progress, heartbeat_s, f"{name}: {activity}", start
            )
        finally:
            _kill_group(proc)  # nothing of the probe outlives it (a timeout, a signal, an exception)
            with _LIVE_LOCK:
                _LIVE.discard(proc)
        seconds = time.perf_counter() - start
        return ProbeRun(
            name,
            proc.returncode,
            _parse_result(stdout),
            seconds,
            stdout,
            stderr,
            timed_out=timed_out,
            caches=caches,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


_LIVE: set[subprocess.Popen] = set()  # the probes running now, in any thread
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()


def stop_all() -> None:
    """End every running probe's process group now and start no new one (bin/envcheck on SIGTERM/SIGINT:
    the threads waiting on probes return at once, so their scratch dirs are removed before it exits)."""
    _STOPPING.set()
    with _LIVE_LOCK:
        for proc in list(_LIVE):
            _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _communicate(proc, timeout, progress, heartbeat_s, doing, start) -> tuple[str, str, bool]:
    deadline = start + timeout
    while True:
        wait = min(heartbeat_s, max(deadline - time.perf_counter(), 0.01))
        try:
            stdout, stderr = proc.communicate(timeout=wait)
            return stdout, stderr, False
        except subprocess.TimeoutExpired:
            if time.perf_counter() >= deadline:
                _kill_group(proc)
                stdout, stderr = proc.communicate()
                return stdout, stderr, True
            if progress is not None:
                progress(f"{doing} ({time.perf_counter() - start:.0f} s)")


def _parse_result(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            try:
                result = json.loads(line[len(RESULT_MARKER) :])
            except json.JSONDecodeError:
                return {}
            return result if isinstance(result, dict) else {}
    return {}


def nonce() -> str:
    return f"{os.getpid()}-{time.time_ns()}"
