"""Cached, test-only environments holding lerobot's dataset writer, so the tests read datasets that LeRobot
itself wrote: `lerobot==0.3.3` (the release upstream LingBot-VA used; LeRobot's v2.1 layout) and
`lerobot==0.4.4` (the newest on the package index; the v3.0 layout, many episodes per file).

    site = lerobot_site()                       # ~/.cache/lingbot-fixtures/lerobot-0.3.3-<pins hash>/site
    site = lerobot_site(version="0.4.4")        # ~/.cache/lingbot-fixtures/lerobot-0.4.4-<pins hash>/site
    run_writer(script, args, site)              # the tool env's python with `site` first on PYTHONPATH

Never a product dependency. `pip install --target site --no-deps` of lerobot and ONLY what its writer
(`LeRobotDataset.create`, `add_frame`, `save_episode`, and the modules they import) needs, every one
pinned (PINS); torch 2.13.0 (CPU here), numpy, Pillow, av, ... are the tool env's own, so nothing pulls a
CUDA torch. torchvision, imported but not called by the writer, is a stand-in module in
tests/support/lerobot_write.py (PyPI's 0.28.0 is the CUDA build; its ops do not load beside the CPU torch).
lerobot's declared requirements (torch<2.8, wandb, rerun-sdk, gymnasium, ...) are not
installed: the writer does not import them. huggingface_hub and fsspec are pinned to the versions
datasets 3.6.0 accepts; they shadow the tool env's only in the writer's process. lerobot 0.4.4 (declares
torch<2.11, diffusers<0.36, torchcodec, wandb, ...) gets PINS_V3: datasets 4.0.0 (its datasets>=4), and
accelerate (lerobot.utils.utils imports it at module level; its own imports, psutil, safetensors, pyyaml,
are the tool env's); its writer never imports diffusers or torchcodec, so neither is installed. Built
into a temporary folder and renamed into place (a killed build is never reused).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .toolchain import default_cache_root

PINS = (
    "lerobot==0.3.3",
    "datasets==3.6.0",  # lerobot 0.3.3: datasets<=3.6.0
    "huggingface_hub==0.35.3",  # lerobot 0.3.3: >=0.34.2 (datasets 3.6 predates huggingface_hub 1.x)
    "fsspec==2025.3.0",  # datasets 3.6.0: fsspec<=2025.3.0
    "pyarrow==21.0.0",
    "pandas==2.3.3",
    "python-dateutil==2.9.0.post0",
    "pytz==2025.2",
    "tzdata==2025.2",
    "six==1.17.0",
    "dill==0.3.8",
    "multiprocess==0.70.16",
    "xxhash==3.6.0",
    "jsonlines==4.0.0",
    "attrs==25.4.0",
)


PINS_V3 = (
    "lerobot==0.4.4",
    "datasets==4.0.0",  # lerobot 0.4.4: datasets>=4.0.0,<5
    "huggingface_hub==0.35.3",  # lerobot 0.4.4: >=0.34.2,<0.36
    "fsspec==2025.3.0",  # datasets 4.0.0: fsspec<=2025.3.0
    "accelerate==1.10.1",  # lerobot 0.4.4: >=1.10; imported, not called, by the writer
    *PINS[4:],
)
VERSIONS = {"0.3.3": PINS, "0.4.4": PINS_V3}


class LerobotEnvError(RuntimeError):
    pass


def lerobot_site(cache_root: Path | None = None, version: str = "0.3.3") -> Path:
    """The site folder holding the writer (built on first use; about a minute with a warm pip cache)."""
    pins = VERSIONS[version]
    cache_root = Path(cache_root) if cache_root is not None else default_cache_root()
    digest = hashlib.sha256("\n".join(pins).encode()).hexdigest()[:12]
    final = cache_root / f"lerobot-{version}-{digest}"
    if (final / "site" / "lerobot").is_dir():
        return final / "site"
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".lerobot-build-", dir=cache_root))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
             "--target", str(tmp / "site"), *pins],
            capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode != 0:
            raise LerobotEnvError(f"pip install --target ... {' '.join(pins)} failed:\n{proc.stderr[-3000:]}")
        (tmp / "PINS").write_text("\n".join(pins) + "\n")
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "site" / "lerobot").is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final / "site"


def writer_env(site: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH", "")])])
    env["HF_HUB_OFFLINE"] = "1"
    env["HF_DATASETS_OFFLINE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_writer(script: Path, args: list[str], site: Path, timeout: float = 300) -> str:
    """Run a writer script with lerobot importable; its stdout (a failure raises with its output)."""
    proc = subprocess.run(
        [sys.executable, str(script), *args], env=writer_env(site), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    if proc.returncode != 0:
        raise LerobotEnvError(
            f"{script.name} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-4000:]}"
        )
    return proc.stdout
