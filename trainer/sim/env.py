"""The LIBERO simulator environment on this node: built on first use, its GL backend chosen and said.

    check_platform("libero", fix)           # SimEnvError on a platform the locks have no wheels for
    python = ensure_env("libero", say)      # sim/build.sh libero: .sim/libero-<machine> built (or waited
                                            # for) once ($LINGBOT_SIM_HOME/libero-<machine>-<hash> if set)
    gl = choose_gl(python, say)             # "egl", else "osmesa"; SimEnvError naming the package if neither
    env = worker_env(python, gl)            # the environment a worker process runs with
    env_identity("libero")                  # the hash of its locks (sim/build.sh's), no build

check_platform reads sim/<name>/platforms (the machines the locks have wheels for: x86_64); bin/train's
preflight (eval.sim, the CPU scale's recorded dataset) and bin/evaluate --sim ask it before anything else.
ensure_env runs sim/build.sh (a flock'd build with a ready-marker keyed by the locks' hash and the
platform, as bin/_tool_env.sh builds .venv; see that script for what is built and checked); it returns at
once when the prefix is ready. The GL probe runs in the simulator env, in a subprocess per backend:
mujoco's own `GLContext(64, 64)` made current, what robosuite's offscreen renderer does first. EGL is
tried first (a GPU node's driver, or Mesa's llvmpipe through libegl1 + libgl1-mesa-dri on a CPU node),
then OSMesa (libosmesa6). The choice is made per node (a login node and a worker may differ) and said in
one line. worker_env sets MUJOCO_GL and PYOPENGL_PLATFORM to it, LIBERO_CONFIG_PATH to the config
sim/build.sh wrote (so `import libero.libero` never prompts), and PYTHONPATH to this repository.
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BACKENDS = {  # backend -> the Debian packages that provide it
    "egl": "libegl1 libgl1-mesa-dri",
    "osmesa": "libosmesa6",
}
PROBE = "import mujoco; c = mujoco.GLContext(64, 64); c.make_current(); c.free(); print('ok')"


class SimEnvError(RuntimeError):
    """The simulator environment cannot be built or cannot render here (one line: why, and the fix)."""


def home() -> Path:
    """Where sim/build.sh keeps the simulator envs, their locks and logs: $LINGBOT_SIM_HOME, else .sim/."""
    return Path(os.environ.get("LINGBOT_SIM_HOME") or REPO / ".sim")


def platforms(name: str) -> tuple[str, ...]:
    """The machines (`uname -m`) sim/<name>'s locks have wheels for: sim/<name>/platforms (sim/build.sh reads
    the same file, and refuses any other)."""
    text = (REPO / "sim" / name / "platforms").read_text()
    return tuple(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


def check_platform(name: str, fix: str, machine: str | None = None) -> None:
    """SimEnvError unless this node's platform (`machine`: platform.machine() unless given) is one the
    locks have wheels for; the line names it, the ones that are, and `fix` (what the caller can do)."""
    import platform

    machine = machine or platform.machine()
    known = platforms(name)
    if machine not in known:
        raise SimEnvError(
            f"this node is {machine}: the {name} simulator env's locks have wheels for {', '.join(known)} "
            f"only (sim/{name}/platforms: torch's CPU wheel)"
            + (f"; {fix}" if fix else f"; run the simulator on a {' or '.join(known)} node")
        )


def ensure_env(name: str, say: Callable[[str], None]) -> Path:
    """The simulator env's python, building it first when it is missing or stale (stderr passes through)."""
    check_platform(name, "")
    proc = subprocess.run([str(REPO / "sim" / "build.sh"), name], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SimEnvError(
            f"sim/build.sh {name} exited {proc.returncode} (its reason above; log {home() / f'{name}.log'})"
        )
    python = Path(proc.stdout.strip().splitlines()[-1])
    say(f"evaluate: simulator env {python.parent.parent} (sim/{name}/*.lock)")
    return python


def env_identity(name: str) -> str:
    """The simulator env's identity: the sha256 sim/build.sh keys its ready-marker and its prefix with (its
    lock files, the upstream manifests, its platforms file, build.sh and assets.py, concatenated in its
    glob order, then the machine), computed
    here without building anything. A re-run's episodes must come from an env of the same identity
    (trainer/evaluation/sim/command.py settings_of)."""
    import hashlib

    spec = REPO / "sim" / name
    files = [*sorted(spec.glob("*.lock")), *sorted(spec.glob("*-8f1084e.txt")), spec / "platforms",
             REPO / "sim" / "build.sh", REPO / "trainer" / "sim" / "assets.py"]  # fmt: skip
    machine = f"platform {platform.machine()}\n".encode()  # build.sh keys the env by `uname -m` too
    return hashlib.sha256(b"".join(f.read_bytes() for f in files) + machine).hexdigest()


def worker_env(python: Path, gl: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "MUJOCO_GL": gl, "PYOPENGL_PLATFORM": gl,
        "LIBERO_CONFIG_PATH": str(python.parent.parent / "libero-config"),
        "PYTHONPATH": str(REPO), "PYTHONNOUSERSITE": "1",
    })  # fmt: skip
    return env


def choose_gl(python: Path, say: Callable[[str], None], wanted: str | None = None) -> str:
    """The first backend of `wanted` (default: egl, then osmesa) that makes a context here."""
    tried = []
    for backend in [wanted] if wanted else list(BACKENDS):
        proc = subprocess.run(
            [str(python), "-c", PROBE], env=worker_env(python, backend), capture_output=True, text=True,
            timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if proc.returncode == 0 and proc.stdout.strip().endswith("ok"):
            say(f"evaluate: rendering with MUJOCO_GL={backend}")
            return backend
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        tried.append(f"{backend}: {last[:160]}")
    packages = " or ".join(BACKENDS[b] for b in ([wanted] if wanted else BACKENDS))
    raise SimEnvError(
        f"no OpenGL backend for the simulator's cameras ({'; '.join(tried)}); "
        f"install the Debian package(s): apt-get install {packages}"
    )
