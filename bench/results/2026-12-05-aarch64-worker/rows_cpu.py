"""Each compile row of `envcheck --worker` alone, one after another, with its wall and CPU time (the
probe processes' user + system CPU, from getrusage(RUSAGE_CHILDREN)): run by the env's own python inside
the emulated aarch64 worker, as bin/envcheck --simulate-worker runs envcheck (root, x86 host).

    PYTHONPATH=. .venv/bin/python bench/results/2026-12-05-aarch64-worker/rows_cpu.py PREFIX OUT.json
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from provision import emulation

INNER = """
import json, os, resource, sys, time
from pathlib import Path
from provision.check import checks_compile as comp
from provision.check.context import Context
ctx = Context(prefix=Path(sys.argv[1]), worker=True, fast=False, caller_env=dict(os.environ))
ctx.__dict__["interpreter"] = {"machine": os.uname().machine, "cuda_available": False}
rows = {}
ROWS = (("compile.triton_build", comp.check_triton_build), ("compile.inductor_cpp", comp.check_inductor),
        ("compile.cpp_extension", comp.check_cpp_extension))
for name, check in ROWS:
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    outcome = check(ctx)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows[name] = {"status": outcome.status, "wall_s": round(time.monotonic() - start, 1),
                  "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1),
                  "compile_s": outcome.details.get("compile_s"), "message": outcome.message[:300]}
    print(name, rows[name], flush=True)
json.dump(rows, open(sys.argv[2], "w"), indent=1)
"""

prefix, out = Path(os.path.realpath(sys.argv[1])), Path(sys.argv[2]).absolute()
cache = Path(os.environ.get("LINGBOT_FIXTURES_CACHE") or Path.home() / ".cache" / "lingbot-fixtures")
qemu, root = emulation.qemu_root(cache / "emulation"), emulation.arm64_root(cache / "emulation")
checkout = Path(__file__).resolve().parents[3]
inner = [
    "/usr/bin/env",
    "-C",
    str(checkout),
    "-",
    "PATH=/usr/bin:/bin",
    f"HOME={Path.home()}",
    f"QEMU_CPU={emulation.GRACE_QEMU_CPU}",
    str(prefix / "bin" / "python"),
    "-c",
    INNER,
    str(prefix),
    str(out),
]
with emulation.binfmt(qemu):
    sys.exit(subprocess.run(emulation.chroot_command(root, inner, [prefix, checkout, out.parent])).returncode)
