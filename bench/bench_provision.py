"""Provision timings: cold install, warm install (a second env from the package cache), no-op re-run.

    .venv/bin/python bench/bench_provision.py [--repeat 3]

Uses the toolchain stand-in (tests/support/toolchain.py: gcc/g++/binutils/sysroot as conda packages,
~60 MB compressed; built by running the tests' builder as a program, bench/ imports nothing of tests/) in a
local channel, locked by `bin/provision --relock`, and times `python -m
provision.cli` end to end (process start included), as a user running bin/provision sees it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import fixture_program  # noqa: E402


def toolchain_packages() -> list[Path]:
    """The toolchain stand-in's .conda files (tests/support/toolchain.py builds and caches them), got by
    running the tests' builder as a program: bench/ never imports tests/."""
    code = "from tests.support.toolchain import toolchain_packages\nfor p in toolchain_packages(): print(p)"
    return [Path(line) for line in fixture_program(code, timeout=3600).splitlines() if line]


def index_channel(channel: Path) -> None:
    """repodata.json for every subdir of a local channel (noarch/ made first), as bin/provision --export
    indexes its kit: rattler's indexer, in a loop of its own."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from rattler.index import index_fs

    (channel / "noarch").mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, index_fs(channel, force=True, write_shards=False)).result()


def timed(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "provision.cli", *args, "-q"],
        cwd=REPO,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    opts = parser.parse_args()
    rows: dict[str, list[float]] = {
        "cold (empty package cache)": [],
        "warm (second env, cached pkgs)": [],
        "no-op (env up to date)": [],
        "--export DIR (verify + copy + index)": [],
        "--from DIR (new env, empty package cache)": [],
    }
    packages = toolchain_packages()
    size = sum(p.stat().st_size for p in packages) / 1e6
    for _ in range(opts.repeat):
        with tempfile.TemporaryDirectory(prefix="bench-provision-") as tmpdir:
            tmp = Path(tmpdir)
            channel = tmp / "channel"
            (channel / "linux-64").mkdir(parents=True)
            for pkg in packages:
                shutil.copy2(pkg, channel / "linux-64" / pkg.name)
            index_channel(channel)
            spec = tmp / "environment.yml"
            spec.write_text(
                f"name: bench-env\nchannels:\n  - {channel}\ndependencies:\n"
                "  - gcc_linux-64\n  - gxx_linux-64\n  - sysroot_linux-64\n"
            )
            env = {**os.environ, "CONDA_ENVS_PATH": str(tmp / "envs"), "LINGBOT_PKGS_DIR": str(tmp / "cache")}
            subprocess.run(
                [sys.executable, "-m", "provision.cli", "-f", str(spec), "--relock", "-q"],
                cwd=REPO,
                env=env,
                check=True,
                stdout=subprocess.DEVNULL,
            )
            rows["cold (empty package cache)"].append(timed(["-f", str(spec)], env))
            rows["warm (second env, cached pkgs)"].append(
                timed(["-f", str(spec), "-p", str(tmp / "envs2" / "b")], env)
            )
            rows["no-op (env up to date)"].append(timed(["-f", str(spec)], env))
            rows["--export DIR (verify + copy + index)"].append(
                timed(["-f", str(spec), "--export", str(tmp / "kit")], env)
            )
            offline = {**env, "LINGBOT_PKGS_DIR": str(tmp / "cache-offline")}
            rows["--from DIR (new env, empty package cache)"].append(
                timed(["-f", str(spec), "--from", str(tmp / "kit"), "-p", str(tmp / "envs3" / "c")], offline)
            )
    print(
        f"bin/provision timings: toolchain stand-in, {len(packages)} packages, {size:.0f} MB compressed; "
        f"median of {opts.repeat} (min-max), seconds, process start included"
    )
    print(f"{'case':44s} {'median':>8s} {'min':>8s} {'max':>8s}")
    for name, values in rows.items():
        print(f"{name:44s} {statistics.median(values):8.2f} {min(values):8.2f} {max(values):8.2f}")


if __name__ == "__main__":
    main()
