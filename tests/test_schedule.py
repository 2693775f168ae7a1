"""The whole suite's parallel plan (tests/support/schedule.py): `once` builds a shared fixture once per run,
never hands out a failed build's remains, and waits on another worker's build with a deadline that names
it; the collection order puts FIRST's modules first, then heavy, then fast."""

from __future__ import annotations

import fcntl
import uuid
from pathlib import Path

import pytest

from tests.support import schedule

pytestmark = pytest.mark.fast


def test_once_builds_once_and_a_failed_build_is_never_reused(tmp_path_factory):
    name = f"test-once-{uuid.uuid4().hex}"  # in this run's real shared dir, so a name of its own
    shared = schedule.shared_dir(tmp_path_factory)
    calls: list[Path] = []

    def broken(target: Path) -> Path:
        calls.append(target)
        (target / "half-written").write_text("x")
        raise RuntimeError("the build failed")

    def good(target: Path) -> Path:
        calls.append(target)
        assert list(target.iterdir()) == []  # the failed build's remains were removed, not reused
        (target / "result").write_text("ok")
        return target / "result"

    with pytest.raises(RuntimeError, match="the build failed"):
        schedule.once(tmp_path_factory, name, broken)
    assert not (shared / f"{name}.done").exists()
    first = schedule.once(tmp_path_factory, name, good)
    again = schedule.once(tmp_path_factory, name, good)
    assert first == again == shared / name / "result" and len(calls) == 2
    assert (shared / f"{name}.done").read_text() == str(first)


def test_once_waits_for_another_workers_build_with_a_deadline_that_names_it(tmp_path_factory):
    name = f"test-wait-{uuid.uuid4().hex}"
    shared = schedule.shared_dir(tmp_path_factory)
    with open(shared / f"{name}.lock", "w") as held:  # another worker, mid-build
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(TimeoutError, match=rf"waited 1 s for another xdist worker to build {name}"):
            schedule.once(tmp_path_factory, name, lambda target: target, timeout=1)


class _Item:
    def __init__(self, nodeid: str, heavy: bool) -> None:
        self.nodeid, self.heavy = nodeid, heavy

    def get_closest_marker(self, name: str):
        return object() if name == "heavy" and self.heavy else None


def test_first_modules_then_heavy_then_fast_in_collection_order():
    items = [
        _Item("tests/test_a.py::fast_one", heavy=False),
        _Item("tests/test_b.py::heavy_one", heavy=True),
        _Item(f"{schedule.FIRST[1]}::x", heavy=True),
        _Item("tests/test_a.py::fast_two", heavy=False),
        _Item(f"{schedule.FIRST[0]}::y", heavy=True),
        _Item("tests/test_c.py::heavy_two", heavy=True),
    ]
    items.sort(key=schedule.rank)  # type: ignore[arg-type]  # the hook sorts pytest.Items the same way
    assert [i.nodeid.split("::")[1] for i in items] == [
        "y", "x", "heavy_one", "heavy_two", "fast_one", "fast_two"
    ]  # fmt: skip
