"""Run every benchmark and write bench/results/<date>.md: the machine, the command, one table per bench.

    .venv/bin/python bench/run_all.py            # all of them (~10 minutes on 2 cores)
    .venv/bin/python bench/run_all.py --quick    # fewer rounds and sizes (~5 minutes)
    .venv/bin/python bench/run_all.py --only grad_accum attention

A bench that fails is reported as failed in the file (with its error) and makes the exit status 1;
the others still run.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, machine  # noqa: E402

BENCHES = ("grad_accum", "attention", "checkpoint", "nonfinite", "restart", "provision")
RESULTS = REPO / "bench" / "results"


def run_one(name: str, quick: bool) -> str:
    """The markdown of one bench. Modules with run(quick) are called; others (bench_provision.py, owned
    by the provision helper) run as a script whose stdout is quoted."""
    path = REPO / "bench" / f"bench_{name}.py"
    if not path.exists():
        return f"_bench/bench_{name}.py not present: skipped._\n"
    module = importlib.import_module(f"bench.bench_{name}")
    if hasattr(module, "run"):
        return "\n".join(table.markdown() for table in module.run(quick))
    args = ["--repeat", "1"] if quick else []
    proc = subprocess.run(
        [sys.executable, str(path), *args], cwd=REPO, capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{path.name} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, repeats and sizes")
    parser.add_argument(
        "--only", nargs="+", choices=BENCHES, metavar="BENCH", help=f"a subset of {', '.join(BENCHES)}"
    )
    parser.add_argument("--out", type=Path, help="result file (default bench/results/<date>[-quick].md)")
    args = parser.parse_args()

    started = time.perf_counter()
    info = machine()
    command = " ".join([".venv/bin/python", "bench/run_all.py", *sys.argv[1:]])
    header = [
        f"# Benchmarks {datetime.datetime.now().isoformat(timespec='minutes')}",
        "",
        f"Command: `{command}`",
        "",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in info.items()),
        "",
    ]
    print("\n".join(header), flush=True)
    sections, failed = [], []
    for name in args.only or BENCHES:
        t0 = time.perf_counter()
        try:
            body = run_one(name, args.quick)
        except Exception:
            failed.append(name)
            body = f"**bench_{name} FAILED**\n\n```\n{traceback.format_exc()[-3000:]}```\n"
        section = f"## {name} ({time.perf_counter() - t0:.0f} s)\n\n{body}"
        print(section, flush=True)
        sections.append(section)
    footer = f"Total {time.perf_counter() - started:.0f} s." + (
        f" Failed: {', '.join(failed)}." if failed else ""
    )
    print(footer)

    out = args.out or RESULTS / f"{datetime.date.today().isoformat()}{'-quick' if args.quick else ''}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".md.tmp")
    tmp.write_text("\n".join(header + sections + [footer, ""]))
    tmp.replace(out)  # a run that dies half-way leaves no half-written result file
    print(f"wrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
