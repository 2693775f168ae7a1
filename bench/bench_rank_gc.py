"""The rank's cyclic garbage collector: off during its imports and frozen out of their objects
(trainer/loop/train.py), against the collector left as Python starts it, on the same 2-rank tiny CPU run.

    .venv/bin/python bench/bench_rank_gc.py [--rounds 5] [--out bench/results/<date>-rank_gc.md]

Two trees, the same minute: this checkout ("frozen"), and a copy of its trainer/ and provision/ whose rank
entry has the three collector lines turned into no-ops ("as started"; the copy fails loudly if those lines
are not found exactly once). Each launch is `python -m trainer.launcher furniture_train 2 --cpu-scale` in a
fresh run dir with LINGBOT_REPO_ROOT at its tree (the launcher puts that tree first on the ranks'
PYTHONPATH), the compile-check pass recorded once per tree and copied into each run dir (as a requeue onto
the same node reuses it; each launch must say "not rerun"). CPU is the whole launch's (launcher, torchrun,
both ranks: RUSAGE_CHILDREN of the waited launcher), medians over the rounds, the variants interleaved; the
last step's losses must be equal in every launch (the collector changes no number).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RANK_ENTRY = Path("trainer/loop/train.py")
NO_OPS = {  # the collector lines of the rank entry, and what the "as started" tree runs instead
    "    gc.disable()\n": "    pass\n",
    "    gc.freeze()": "    pass",
    "    gc.enable()\n": "    pass\n",
}
OVERRIDES = [
    "model.dim=48", "model.heads=2", "model.depth=2", "model.latent_size=8", "model.attn_block=16",
    "data.frames=4", "data.generated_episodes=4", "data.generated_length=20", "data.val_episodes=1",
    "train.grad_accum=2", "train.steps=6", "train.warmup_steps=2", "checkpoint.every=2",
]  # fmt: skip
LAST = re.compile(r"step 6/6 \| latent_loss (\S+) \| action_loss (\S+)")


def as_started(tree: Path) -> None:
    """`tree` (a copy of the checkout) with the rank's collector lines as no-ops."""
    path = tree / RANK_ENTRY
    text = path.read_text()
    for line, replacement in NO_OPS.items():
        if text.count(line) != 1:
            raise SystemExit(
                f"{RANK_ENTRY}: expected {line.strip()!r} exactly once; update NO_OPS in {__file__}"
            )
        text = text.replace(line, replacement)
    path.write_text(text)


def copy_tree(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in ("trainer", "provision"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "pyproject.toml", dest / "pyproject.toml")
    return dest


def launch(tree: Path, run_dir: Path, data: Path, record: Path | None) -> tuple[float, str, str]:
    """One launch: (CPU s of the whole process tree, the last step's losses, stderr)."""
    from trainer.launcher.preflight import record_path

    if record is not None:
        record_path(run_dir).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(record, record_path(run_dir))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LINGBOT_", "SLURM_", "MASTER_"))}
    env.update(LINGBOT_REPO_ROOT=str(tree), PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    sets = [a for o in [*OVERRIDES, f"data.path={data}"] for a in ("--set", o)]
    argv = [sys.executable, "-m", "trainer.launcher", "furniture_train", "2", "--cpu-scale", "--run-dir",
            str(run_dir), *sets]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = proc.stdout + proc.stderr
    found = LAST.search(out)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"{argv}: exit {proc.returncode}\n{out[-3000:]}")
    if record is not None and "not rerun" not in out:
        raise SystemExit(
            f"{run_dir}: the compile checks ran again (the recorded pass was not reused)\n{out[-2000:]}"
        )
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, " / ".join(found.groups()), out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    from bench.common import machine, publish
    from trainer.launcher.preflight import record_path

    scratch = Path(tempfile.mkdtemp(prefix="bench-rank-gc-"))
    trees = {"frozen": REPO, "as started": copy_tree(scratch / "as-started")}
    as_started(trees["as started"])
    for tree in trees.values():  # both trees' bytecode up to date (under PYTHONDONTWRITEBYTECODE=1 every
        # process would else compile the copy afresh)
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", "trainer", "provision"], cwd=tree, check=True
        )
    samples: dict[str, list[float]] = {name: [] for name in trees}
    losses: set[str] = set()
    try:
        records = {}
        for name, tree in trees.items():  # the compile checks once per tree (their code is in the key)
            seed = scratch / f"seed-{name}"
            launch(tree, seed, scratch / "data", None)
            records[name] = record_path(seed)
        for i in range(args.rounds):
            for name, tree in trees.items():
                cpu, last, _ = launch(tree, scratch / f"run-{i}-{name}".replace(" ", "_"), scratch / "data",
                                      records[name])  # fmt: skip
                samples[name].append(cpu)
                losses.add(last)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if len(losses) != 1:
        raise SystemExit(f"the last step's losses differ between launches: {sorted(losses)}")
    med = {name: statistics.median(v) for name, v in samples.items()}
    lines = [
        "# The rank's collector: frozen imports against the collector as Python starts it",
        "",
        "machine: " + ", ".join(f"{k} {v}" for k, v in machine().items()),
        f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}",
        f"command: `.venv/bin/python bench/bench_rank_gc.py --rounds {args.rounds}`",
        f"date: {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        "| rank collector | CPU s per 2-rank launch, median | min | max |",
        "|---|---|---|---|",
        *(f"| {name} | {med[name]:.2f} | {min(v):.2f} | {max(v):.2f} |" for name, v in samples.items()),
        "",
        f"frozen / as started: {med['frozen'] / med['as started']:.2f}; "
        f"the last step's losses in every launch: {losses.pop()}",
    ]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
