"""The launcher's own cost per launch on a CPU node: bin/train's process start-up and a refused launch,
in CPU seconds, against the imports every launch also pays in its ranks.

    .venv/bin/python bench/bench_launch_cpu.py [--rounds 7] [--out bench/results/<date>-launch_cpu.md]

Each command runs as a fresh process, the commands interleaved round by round (ABCD ABCD ...); CPU time
is the child's user + system (resource.getrusage), medians over the rounds:
  A  `python -c "import trainer.launcher.main"`: what bin/train's launcher imports
  B  `python -m trainer.launcher furniture_train 2 --set train.lr=-1`: a launch refused by the config
     rules (exit 2), start-up to exit
  C  `python -c "import torch"`
  D  `python -c "import trainer.loop.train"`: what every rank imports
  E  `python -m trainer.launcher furniture_train 2 --cpu-scale --preflight-only --run-dir R`: the launcher's
     whole way to torchrun (config, env checks, the inputs check, the space check), the compile checks
     reused from the pass the uncounted first round recorded in R (as a requeue onto the same node does)
A launcher that imported torch paid C (or more: DCP pulls in torch.distributed.tensor and sympy) on each
of the suite's ~130 launches, and on every launch of a Slurm job's two steps. Also asserts that A leaves
torch unimported. E came back to torch's import once (2026-12-06: the inputs check imported the encoders
for their folder rules; trainer/data/encoding/folders.py owns those now, without torch).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TORCH_FREE = "import sys, trainer.launcher.main; sys.exit('torch' in sys.modules)"
COMMANDS = {
    "A launcher import": [sys.executable, "-c", TORCH_FREE],
    "B refused launch (exit 2)": [sys.executable, "-m", "trainer.launcher", "furniture_train", "2", "--set",
                                  "train.lr=-1"],
    "C import torch": [sys.executable, "-c", "import torch"],
    "D rank import": [sys.executable, "-c", "import trainer.loop.train"],
}  # fmt: skip
PREFLIGHT = "E launcher to torchrun (--preflight-only)"
EXPECTED_EXIT = {"B refused launch (exit 2)": 2}


def cpu_of(argv: list[str], expected: int) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != expected:
        raise SystemExit(f"{argv}: exit {proc.returncode}, expected {expected}\n{proc.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    from bench.common import machine, publish

    scratch = Path(tempfile.mkdtemp(prefix="bench-launch-"))
    commands = {
        **COMMANDS,
        PREFLIGHT: [
            sys.executable, "-m", "trainer.launcher", "furniture_train", "2", "--cpu-scale",
            "--preflight-only", "--run-dir", str(scratch / "run"), "--set", f"data.path={scratch / 'data'}",
        ],
    }  # fmt: skip
    samples: dict[str, list[float]] = {name: [] for name in commands}
    try:  # the first round (not counted) warms the page cache; E's records the compile-check pass
        for _ in range(args.rounds + 1):
            for name, command in commands.items():
                samples[name].append(cpu_of(command, EXPECTED_EXIT.get(name, 0)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    med = {name: statistics.median(values[1:]) for name, values in samples.items()}

    def ratio(a: str, b: str) -> str:
        return f"{med[a] / med[b]:.2f}"

    lines = [
        "# The launcher's CPU per launch",
        "",
        "machine: " + ", ".join(f"{k} {v}" for k, v in machine().items()),
        f"load average at the end: {' '.join(f'{x:.1f}' for x in __import__('os').getloadavg())}",
        f"command: `.venv/bin/python bench/bench_launch_cpu.py --rounds {args.rounds}`",
        "",
        "| process | CPU s median | min | max |",
        "|---|---|---|---|",
        *(
            f"| {name} | {med[name]:.2f} | {min(v[1:]):.2f} | {max(v[1:]):.2f} |"
            for name, v in samples.items()
        ),
        "",
        f"launcher import / torch import: {ratio('A launcher import', 'C import torch')}; "
        f"refused launch / rank import: {ratio('B refused launch (exit 2)', 'D rank import')}; "
        f"launcher to torchrun / torch import: {ratio(PREFLIGHT, 'C import torch')}; "
        "the launcher import leaves torch unimported (A exits 0 only then)",
    ]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
