"""Where the project checkout is: the one repository-root notion for provision/ and trainer/.

Contract: `repo_root()` returns the directory holding this project's pyproject.toml (the checkout whose
bin/* the user runs), whether the code runs from that checkout or from the copy that `bin/provision`
installed into an env's site-packages. Order: $LINGBOT_REPO_ROOT (exported by bin/_tool_env.sh, so every
bin/* command and the ranks it starts agree), then the checkout this file lives in, then the current
directory or one of its parents. Nothing found is a `RepoRootError` that says how to fix it.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

PROJECT_NAME = "lingbot-env"
ENV_VAR = "LINGBOT_REPO_ROOT"


class RepoRootError(RuntimeError):
    """No checkout of this project could be found."""


def is_checkout(path: Path) -> bool:
    """True when `path` holds this project's pyproject.toml."""
    pyproject = path / "pyproject.toml"
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return False
    return f'name = "{PROJECT_NAME}"' in text


@cache
def repo_root() -> Path:
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        path = Path(explicit).expanduser().resolve()
        if not is_checkout(path):
            raise RepoRootError(
                f"${ENV_VAR}={explicit} is not a checkout of {PROJECT_NAME} (no pyproject.toml naming it): "
                f"unset it or point it at the checkout"
            )
        return path
    here = Path(__file__).resolve().parent.parent
    if is_checkout(here):
        return here
    cwd = Path.cwd().resolve()
    for candidate in (cwd, *cwd.parents):
        if is_checkout(candidate):
            return candidate
    raise RepoRootError(
        f"cannot find the {PROJECT_NAME} checkout: this code runs from {here} (an installed copy) and "
        f"{cwd} is not inside a checkout; run from the checkout (bin/train, bin/envcheck) or set "
        f"{ENV_VAR}=/path/to/checkout"
    )
