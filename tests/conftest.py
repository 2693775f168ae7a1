"""Shared fixtures: the compiler-less worker simulation and a local conda channel with a real toolchain.

Every test is in exactly one lane, `fast` or `heavy` (tests/support/lanes.py; its collection hook is
called here, so a test in neither or both fails the run). The same hook then applies the parallel plan
(tests/support/schedule.py: the long-first order for the xdist workers).

worker             session; a provision.worker_sim.WorkerSimulation. Strictness is asserted
                   before every test that uses it; skips (never passes) where namespaces or
                   overlays are not permitted.
worker_env         function; a clean environment for a process inside the simulation (private
                   TMPDIR and Inductor/Triton caches, OMP_NUM_THREADS=1, no CC/CXX/CPATH/LD_*).
toolchain_channel  session; Path of an indexed local channel holding the toolchain stand-in
                   (gcc_linux-64, gxx_linux-64, sysroot_linux-64, ...) and `lingbot-probe`.
preflight_record   session; the record of one real `--preflight-only` pass of the tool env on this node,
                   made once per run for all xdist workers (schedule.once)
                   (tests/support/runs.py: seed_preflight puts it in a run dir, where the product's own
                   reuse rule decides whether it applies).
run_inductor_cache function; the machine's Inductor cache for the tests that compile inside the pytest
                   process: TORCHINDUCTOR_CACHE_DIR set (for the test only) to
                   ~/.cache/lingbot-fixtures/inductor-tests-torch<version> (LINGBOT_FIXTURES_CACHE),
                   which every xdist worker and every later run shares, as bin/train's ranks share
                   ~/.cache/lingbot/torchinductor_<env>_<kind> (trainer/launcher/compile_cache.py).
                   The claims of those tests are Dynamo's counters (graphs, breaks, recompiles) and
                   numbers against eager or SDPA, which hold whatever the cache holds; Inductor keys
                   each entry by graph, config and torch version, and (measured) by the checkout's path: a
                   later run in the same checkout reuses it, a clone elsewhere compiles again
                   (docs/tests.md, "A fresh AMD EPYC machine"). Emptied at the run's start when over
                   INDUCTOR_TESTS_CAP bytes. Never for probes or product runs: envcheck's probes use
                   private empty caches by design, and bin/train gets the session's variables (below).

Each test starts with the compile-cache variables the session started with (autouse): torch exports
TORCHINDUCTOR_CACHE_DIR into the process that compiled (torch/_inductor/runtime/cache_dir_utils.py), and
a later test's bin/train launched from that pytest worker would inherit it and treat Inductor's default
dir, with every kernel the compile tests made, as its persistent cache, copying it on each launch.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
from pathlib import Path

import pytest

# `tests.support` must import however pytest was started (`pytest`, `python -m pytest`, from any cwd).
_REPO = str(Path(__file__).resolve().parents[1])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from provision.worker_sim import WorkerSimulation, available  # noqa: E402
from tests.support.channel import PREFIX_PLACEHOLDER, index_channel, make_package  # noqa: E402
from tests.support.lanes import pytest_collection_modifyitems as _lanes  # noqa: E402  (the lane check)
from tests.support.python_pkg import default_cache_root  # noqa: E402
from tests.support.runs import clean_env, record_preflight  # noqa: E402
from tests.support.schedule import once  # noqa: E402
from tests.support.schedule import pytest_collection_modifyitems as _schedule  # noqa: E402
from tests.support.toolchain import toolchain_packages  # noqa: E402

TOOL_PYTHON = sys.executable  # the tool venv's python; its base (pyenv) lives outside /usr
PROBE_PACKAGE = "lingbot-probe"
PROBE_VERSION = "1.0"


_CACHE_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
_SESSION_CACHE_VARS = {var: os.environ.get(var) for var in _CACHE_VARS}


@pytest.fixture(autouse=True)
def _compile_cache_variables_as_the_session_started():
    """See the module docstring: what a compile in this process exported does not reach the next test."""
    yield
    for var, value in _SESSION_CACHE_VARS.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


@pytest.fixture(scope="session")
def worker() -> WorkerSimulation:
    ok, reason = available()
    if not ok:
        pytest.skip(f"worker simulation unavailable: {reason}")
    sim = WorkerSimulation()
    sim.assert_strict()
    return sim


@pytest.fixture(autouse=True)
def _worker_strict_before_each_use(request):
    # A session fixture could be made lax by an earlier test (or a changed host): check every time.
    if "worker" in request.fixturenames:
        request.getfixturevalue("worker").assert_strict()


@pytest.fixture
def worker_env(tmp_path: Path) -> dict[str, str]:
    """What a batch job on a worker starts with, plus private scratch dirs for this test.

    Inductor keeps precompiled headers under $TMPDIR/torchinductor_<user> whatever
    TORCHINDUCTOR_CACHE_DIR says, so TMPDIR is private too: nothing compiled on the host leaks in.
    """
    scratch = tmp_path / "worker-scratch"
    (scratch / "tmp").mkdir(parents=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(scratch / "tmp"),
        "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
        "TRITON_CACHE_DIR": str(scratch / "triton"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }


@pytest.fixture(scope="session")
def toolchain_channel(tmp_path_factory) -> Path:
    channel = tmp_path_factory.mktemp("toolchain-channel")
    (channel / "linux-64").mkdir()
    for pkg in toolchain_packages():
        _link_or_copy(pkg, channel / "linux-64" / pkg.name)
    make_package(
        channel / "noarch",
        PROBE_PACKAGE,
        PROBE_VERSION,
        {
            "share/lingbot-probe/probe.txt": b"lingbot-probe installed\n",
            "bin/lingbot-probe": f"#!/bin/sh\necho 'lingbot-probe in {PREFIX_PLACEHOLDER}'\n".encode(),
        },
        noarch="generic",
        has_prefix_text=["bin/lingbot-probe"],
    )
    index_channel(channel)
    return channel


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The lane check (tests/support/lanes.py), then the parallel plan (tests/support/schedule.py)."""
    _lanes(config, items)
    _schedule(config, items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (torch and the test modules' imports, hundreds of thousands of objects that
    live as long as the worker) is frozen out of the cyclic collector's reach, as the ranks do
    (trainer/loop/train.py): a full collection during an in-process test walks only what tests allocate."""
    gc.freeze()


INDUCTOR_TESTS_CAP = 512 * 2**20  # ~10 MB a run's new graphs; a cache past this is emptied, not pruned


def _machine_inductor_cache(marker: Path) -> Path:
    """The machine's Inductor cache for in-process compile tests, emptied first when over the cap."""
    import torch

    cache = default_cache_root() / f"inductor-tests-torch{torch.__version__}"
    size = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) if cache.is_dir() else 0
    if size > INDUCTOR_TESTS_CAP:
        shutil.rmtree(cache)
    cache.mkdir(parents=True, exist_ok=True)
    return cache


@pytest.fixture
def run_inductor_cache(tmp_path_factory, monkeypatch) -> Path:
    """TORCHINDUCTOR_CACHE_DIR for this test: the machine's Inductor cache for tests (module docstring)."""
    cache = once(tmp_path_factory, "inductor-cache", _machine_inductor_cache)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    return cache


@pytest.fixture(scope="session")
def preflight_record(tmp_path_factory) -> Path:
    """One recorded pass for the whole run, however many xdist workers (tests/support/schedule.py)."""
    return once(
        tmp_path_factory,
        "preflight-record",
        lambda root: record_preflight(root / "run", clean_env(root / "no-envs")),
    )
