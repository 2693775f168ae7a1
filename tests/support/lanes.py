"""The two test lanes: every test carries exactly one of the markers `fast` and `heavy`.

fast   `bin/test --fast` (pytest -m fast): no daemon, no mount, no worker simulation, no multi-process
       training run or bin/train run; seconds each.
heavy  the rest; only the whole suite (`bin/test`, what .ci/run runs) runs them. Also heavy, to keep
       the quick lane under 2 minutes: a test that installs or solves packages (provision, pip,
       conda-lock), builds the toolchain channel, or compiles through Inductor for tens of seconds.

`pytest_collection_modifyitems` (called first by tests/conftest.py's own hook, so it runs in every run;
`-p tests.support.lanes` makes it a hook on its own) fails the collection, naming each test, when a test
carries neither marker or both (a module's `pytestmark` and a test's own decorator count together).
It runs before `-m` deselects anything, so `-m fast` checks the heavy tests too.
"""

from __future__ import annotations

import pytest

LANES = ("fast", "heavy")


def lane_problems(items: list[pytest.Item]) -> list[str]:
    """One line per test that is in no lane or in both."""
    problems = []
    for item in items:
        lanes = sorted({m.name for m in item.iter_markers() if m.name in LANES})
        if len(lanes) != 1:
            what = "no lane marker" if not lanes else "both lane markers"
            problems.append(f"{item.nodeid}: {what} (mark it exactly one of @pytest.mark.fast / heavy)")
    return problems


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = lane_problems(items)
    if problems:
        raise pytest.UsageError(
            f"{len(problems)} test(s) not in exactly one lane (tests/support/lanes.py):\n  "
            + "\n  ".join(problems)
        )
