"""Which env the ranks run in, and the environment variables they run with.

--env/--prefix must name a complete provisioned env; without them: $CONDA_PREFIX, then the default env,
then the tool environment running this launcher (said loudly by the caller). The env's variables are
applied here (provision.envvars.job_environment), not by shell activation, and this checkout
(provision.paths.repo_root()) is put first on the ranks' PYTHONPATH.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from provision.paths import repo_root
from trainer.launcher.errors import PreflightError

DEFAULT_ENV = "lingbot-b200"


def gpu_count() -> int:
    """torch's count of usable CUDA devices; 0 without importing torch on a CPU-only node (no NVIDIA
    device node, no libcuda), where torch would say 0 after a 2-s import."""
    from provision.nodeinfo import cpu_only_node

    if cpu_only_node():
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# --- which env -------------------------------------------------------------------------------------


@dataclass
class EnvChoice:
    prefix: Path
    python: Path
    provisioned: bool  # False: the tool environment (.venv) running this launcher
    why: str = ""


def tool_env() -> EnvChoice:
    return EnvChoice(Path(sys.prefix), Path(sys.executable), provisioned=False)


def resolve_env(name: str | None, prefix: Path | None, environ: dict[str, str]) -> EnvChoice:
    """--env/--prefix must name a complete env; without them: $CONDA_PREFIX, the default env, the tool env."""
    from provision.prefix import completeness, envs_dir, resolve_prefix

    if name is not None or prefix is not None:
        chosen = resolve_prefix(name=name, prefix=prefix)
        ok, reason = completeness(chosen)
        if not ok:
            raise PreflightError(f"env {chosen} is not usable: {reason}")
        return _provisioned(chosen, "as asked")
    skipped = []
    candidates = []
    if environ.get("CONDA_PREFIX"):
        candidates.append((Path(environ["CONDA_PREFIX"]), "$CONDA_PREFIX"))
    candidates.append((envs_dir() / DEFAULT_ENV, "the default env"))
    for candidate, label in candidates:
        ok, reason = completeness(candidate)
        if ok:
            return _provisioned(candidate, label)
        skipped.append(f"{label} {candidate}: {reason}")
    choice = tool_env()
    choice.why = "; ".join(skipped)
    return choice


def _provisioned(prefix: Path, why: str) -> EnvChoice:
    python = prefix / "bin" / "python"
    if not os.access(python, os.X_OK):
        raise PreflightError(f"env {prefix} has no {python}; re-run bin/provision")
    return EnvChoice(prefix, python, provisioned=True, why=why)


def job_environment(choice: EnvChoice, base: dict[str, str]) -> dict[str, str]:
    """What the ranks run with: the env's variables applied to `base`, and this checkout importable."""
    if choice.provisioned:
        from provision.envvars import job_environment as env_job_environment

        env = env_job_environment(choice.prefix, base)
    else:
        env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo_root()), env.get("PYTHONPATH", "")) if p)
    return env
