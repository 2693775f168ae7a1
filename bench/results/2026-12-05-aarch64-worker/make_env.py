"""Provision the aarch64 stand-in env for the emulated aarch64 worker (root, x86 host), as the opt-in test
tests/test_emulation_aarch64_worker.py does: the lock's aarch64 wheels downloaded once by the host's pip,
then bin/provision's code (lock.make_lock + install.provision, platform linux-aarch64) with the env's own
python running pip under qemu. Prints the prefix and the seconds of each step.

    PYTHONPATH=. .venv/bin/python bench/results/2026-12-05-aarch64-worker/make_env.py
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from provision import emulation
from tests.support.aarch64_env import download_wheels, provision_env

REPO = Path(__file__).resolve().parents[3]
cache = Path(os.environ.get("LINGBOT_FIXTURES_CACHE") or Path.home() / ".cache" / "lingbot-fixtures")
qemu, root = emulation.qemu_root(cache / "emulation"), emulation.arm64_root(cache / "emulation")
start = time.monotonic()
wheels = download_wheels(cache / "aarch64-wheels", REPO / "conda-lock.yml")
fetched = round(time.monotonic() - start, 1)
prefix, times = provision_env(cache / "aarch64-work", wheels, qemu, root)
print("PREFIX", prefix, json.dumps({"wheels_s": fetched, **times}), flush=True)
