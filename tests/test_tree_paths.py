"""No tracked file names a folder of the machine it was written on (issue 42, item 3).

A reader's checkout sits somewhere else: a doc that says `git clone /some/dev/checkout`, a default of
`/some/dev/upstream`, a result that records `/some/dev/worktree/bin/train` works on one machine only.
The folders are computed here, at test time, from this checkout's root: the root itself and the folder it
sits in (its parent), so the rule holds wherever the tree is checked out. A match is that absolute path as
a whole path component (`/srv/dev` matches `/srv/dev` and `/srv/dev/main`, never `/srv/devices` nor
`a/srv/dev`).
Not checked: a root or parent under the system's temporary folder (`/tmp`, a clean clone's home: example
commands under /tmp are allowed), the filesystem root itself, and this file (its examples are made up).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.fast


def _temporary(path: Path) -> bool:
    temps = {Path("/tmp"), Path("/var/tmp"), Path(tempfile.gettempdir()).resolve()}
    return any(path == t or t in path.parents for t in temps)


def machine_folders(root: Path) -> list[Path]:
    """The absolute folders that would tie a file to this machine: the checkout's root and its parent."""
    return [f for f in (root, root.parent) if f != Path(f.anchor) and not _temporary(f)]


def pattern(folders: list[Path]) -> re.Pattern[str]:
    """A folder as a whole absolute path: not preceded by a path character (so not the tail of another
    path, `~/x` or `$HOME/x`), not followed by one (so `/srv/dev` does not match `/srv/devices`)."""
    alternatives = "|".join(re.escape(str(f)) for f in sorted(folders, key=lambda f: -len(str(f))))
    return re.compile(rf"(?<![\w.~$/-])(?:{alternatives})(?![\w.-])[^\s`'\"()<>\[\]]*")


def offending_lines(root: Path, files: list[str], folders: list[Path]) -> list[str]:
    if not folders:
        return []
    found = pattern(folders)
    out = []
    for name in files:
        try:
            text = (root / name).read_text()
        except (UnicodeDecodeError, OSError):  # binary files, a tracked path deleted in the work tree
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if match := found.search(line):
                out.append(f"{name}:{number}: names {match.group(0)!r}: {line.strip()[:160]}")
    return out


def tracked_files(root: Path) -> list[str]:
    done = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"not a git checkout ({done.stderr.strip()[:200]}): no tracked files to check")
    return [name for name in done.stdout.split("\0") if name]


def test_no_tracked_file_names_the_folder_the_checkout_sits_in():
    this = str(Path(__file__).resolve().relative_to(REPO))  # its made-up examples below are not a machine's
    bad = offending_lines(REPO, [f for f in tracked_files(REPO) if f != this], machine_folders(REPO))
    assert not bad, (
        "tracked files name this machine's folders (say `git clone <this repository>`, a path relative to "
        "the checkout, or an environment variable with no machine default):\n" + "\n".join(bad)
    )


def test_the_rule_sees_a_checkout_and_its_siblings_and_nothing_else(tmp_path):
    """On a made-up checkout at /srv/dev/main: its own path, a sibling worktree and the parent are found;
    /tmp examples, other roots, home-relative and relative paths, and longer names are not."""
    root = Path("/srv/dev/main")
    folders = machine_folders(root)
    assert folders == [root, Path("/srv/dev")]
    (tmp_path / "doc.md").write_text(
        "git clone /srv/dev/main /tmp/clone\n"  # 1: the checkout
        "see /srv/dev/wt-other/bin/train\n"  # 2: a sibling
        "cd /srv/dev && ls\n"  # 3: the parent itself
        "git clone <this repository> /tmp/ci-clone\n"
        "~/srv/dev/x and srv/dev/x and $HOME/srv/dev and /srv/devices and /srv/dev.bak\n"
    )
    got = offending_lines(tmp_path, ["doc.md"], folders)
    assert [line.split(": names")[0] for line in got] == ["doc.md:1", "doc.md:2", "doc.md:3"], got
    assert machine_folders(Path("/tmp/ci-clone")) == []  # a clean clone under /tmp: examples there are fine
    assert machine_folders(Path("/main")) == [Path("/main")]  # never the filesystem root
