"""Provisioning for another architecture (an aarch64 env for Grace nodes, built on an x86 login node
onto a shared filesystem): nothing of the target runs here, so no emulation is needed.

Contract: `foreign(platform)` says whether `platform` is not this machine's; `host_install_refusal(
platform, steps)` returns "" when this machine can do `steps` (the pip part, the projects) for an env
of `platform`, else one message naming what is missing and the fix: wheel tags for that platform
(manylinux: linux-64, linux-aarch64, linux-ppc64le) and pypa's `installer` in this Python.

What runs where for a foreign platform: linking the conda packages runs nothing of the target
(py-rattler, the default --installer, copies files and rewrites prefixes; link scripts are not run);
capturing the compilers' activate.d variables is the host's bash sourcing shell scripts; the pip part
and the projects are downloaded, built and unpacked by the host's own Python (provision/
wheel_install.py: its pip downloads the locked wheels for the target's tags and builds the checkout's
pure-Python wheel, pypa's `installer` unpacks them into the env's scheme), never by the env's python.
The host needs its own pip and `installer` (the tool env has both) and the network or a mirror
(--pip-index, --pip-find-links, --from). On the target's own platform the env's own pip does it.
"""

from __future__ import annotations

import importlib.util
import sys


def foreign(platform: str) -> bool:
    from provision.lock import current_platform

    return platform != current_platform()


def host_install_refusal(platform: str, steps: list[str]) -> str:
    """ "" when this machine can install `steps` into an env of `platform`, else why not and the fix."""
    if not foreign(platform) or not steps:
        return ""
    from provision.lock import current_platform
    from provision.pip_lock import PIP_ARCH

    what = " and ".join(steps)
    if platform not in PIP_ARCH:
        return (
            f"the env is for {platform} and this machine is {current_platform()}: {what} need wheels for "
            f"{platform}, and bin/provision knows the wheel tags of {', '.join(PIP_ARCH)} only; run "
            f"bin/provision on a {platform} machine"
        )
    if importlib.util.find_spec("installer") is None:
        return (
            f"the env is for {platform}: this machine installs {what} with pypa's `installer`, which this "
            f"python ({sys.executable}) lacks; run bin/provision from this checkout's tool "
            f"env (bin/* builds it from pyproject.toml), or install it (pip install installer)"
        )
    return ""
