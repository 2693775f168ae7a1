"""A linux-aarch64 env provisioned on this x86 host with no emulation, end to end: bin/provision's own
code (`lock.make_lock`, `install.plan`, `install.provision`) from a tiny local linux-aarch64 channel and a
tiny aarch64 wheel served from a --find-links folder, plus this checkout as the env's project.

The env's `bin/python` is the first 64 bytes of an aarch64 ELF executable: it can run nowhere (not here,
not under qemu: it has no program headers), so a provision that ran it at any step would fail. Every
process the provision starts is recorded too, and none is inside the env. Linux x86-64 hosts only (on an
aarch64 host the stand-in would be of its own platform)."""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision import install, lock
from provision.lock import current_platform
from provision.plan import ProvisionError
from provision.prefix import completeness, read_manifest
from provision.spec import load_spec
from tests.support.channel import index_channel, make_package
from tests.support.wheels import sha256_of, write_simple_index, write_wheel

REPO = Path(__file__).resolve().parents[1]
FOREIGN = "linux-aarch64"
TINY_MODULE = "def main():\n    print('tinyarm on aarch64')\n"
# an ELF64 little-endian executable header for EM_AARCH64 (0xb7), nothing after it
AARCH64_ELF_HEADER = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHI", 2, 0xB7, 1) + bytes(40)

pytestmark = [
    pytest.mark.heavy,
    pytest.mark.skipif(current_platform() != "linux-64", reason="the foreign platform here is linux-aarch64"),
]


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    """A short directory (a console script's shebang names the env's python; past 127 characters pip and
    installer both switch to a /bin/sh trampoline, and this test asserts the plain line)."""
    path = Path(tempfile.mkdtemp(prefix="xa-", dir="/tmp" if os.path.isdir("/tmp") else None))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _channel(root: Path) -> Path:
    chan = root / "channel"
    stub = root / "stub"
    (stub / "bin").mkdir(parents=True)
    (stub / "bin" / "python3.11").write_bytes(AARCH64_ELF_HEADER)
    (stub / "bin" / "python3.11").chmod(0o755)
    os.symlink("python3.11", stub / "bin" / "python")
    files: dict[str, bytes | Path] = {
        "bin/python3.11": stub / "bin" / "python3.11",
        "bin/python": stub / "bin" / "python",
        "lib/python3.11/os.py": b"# the stand-in's stdlib\n",
        "lib/python3.11/site-packages/README.txt": b"site-packages\n",
    }
    make_package(chan / FOREIGN, "python", "3.11.9", files, subdir=FOREIGN)
    # `pip:` in a spec needs a conda `pip`; this one holds no pip at all: nothing in the env runs
    make_package(chan / "noarch", "pip", "24.2", {"share/pip-stand-in.txt": b"no pip\n"}, noarch="generic")
    index_channel(chan)
    return chan


@pytest.fixture(scope="module")
def locked(root: Path) -> dict:
    """The spec, its lock (the pip part resolved for aarch64 by this host's pip) and the wheel folder."""
    chan, wheels = _channel(root), root / "wheels"
    extra = {"tinyarm-1.0.dist-info/entry_points.txt": b"[console_scripts]\ntinyarm-hello = tinyarm:main\n"}
    wheel = write_wheel(wheels, "tinyarm", "1.0", TINY_MODULE, tag="cp311-cp311-manylinux_2_28_aarch64",
                        extra=extra)  # fmt: skip
    index = write_simple_index(root / "simple", [wheel])
    spec_path = root / "spec" / "environment.yml"
    spec_path.parent.mkdir()
    spec_path.write_text(
        f"name: xa\nchannels:\n  - {chan}\nplatforms:\n  - {FOREIGN}\ndependencies:\n  - python 3.11.*\n"
        f"  - pip\n  - pip:\n    - tinyarm==1.0\n    - {REPO}\n"
    )
    spec = load_spec(spec_path)
    vp = lock.VirtualPackages(archspec="aarch64", cuda="")
    lock_path = spec_path.parent / "conda-lock.yml"
    lock.make_lock(spec, lock_path, vpkgs_by_platform={FOREIGN: vp}, mirrors=None,
                   cache_dir=root / "rattler-cache", pip_index=index, log=lambda _: None)  # fmt: skip
    return {"spec": spec, "lock": lock_path, "wheels": wheels, "sha256": sha256_of(wheel)}


def _processes(monkeypatch) -> list[list[str]]:
    """The argv of every process started through subprocess from now on (in this test)."""
    started: list[list[str]] = []
    real = subprocess.Popen

    class Recorded(real):
        def __init__(self, args, *rest, **kwargs):
            started.append([str(a) for a in ([args] if isinstance(args, str | os.PathLike) else args)])
            super().__init__(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", Recorded)
    return started


def test_aarch64_env_is_provisioned_here_running_none_of_its_programs(root, locked, monkeypatch):
    started = _processes(monkeypatch)
    progress, had_build = io.StringIO(), (REPO / "build").exists()
    target = root / "envs" / "xa"
    # what a provision killed during its download leaves: a generation without a manifest, the wheels
    # downloaded so far inside it; the next provision removes it (a kill never keeps GBs behind)
    killed = install.generations_dir(target) / "20261206-000000-killed" / ".lingbot-pip-host-x"
    killed.mkdir(parents=True)
    (killed / "torch-2.13.0-cp311-cp311-manylinux_2_28_aarch64.whl").write_bytes(b"part of a download")
    the_plan = install.plan(locked["spec"], "xa", locked["lock"], target, FOREIGN, log=lambda _: None)
    assert the_plan.projects == [REPO]
    result = install.provision(the_plan, cache_dir=root / "pkgs", pip_find_links=str(locked["wheels"]),
                               progress=install.Progress(stream=progress))  # fmt: skip
    log = progress.getvalue()
    assert result["action"] == "provisioned", log
    assert completeness(target) == (True, "")
    gen = Path(result["generation"])
    assert os.path.realpath(target) == str(gen) and read_manifest(target)["platform"] == FOREIGN
    assert not killed.parent.exists(), "the killed provision's generation and its downloads are removed"
    assert not list(gen.glob(".lingbot-pip-host-*")), "the download folder is gone before the manifest"
    assert read_manifest(target)["pip"] == [{"name": "tinyarm", "version": "1.0", "sha256": locked["sha256"]}]

    # the locked wheel, laid out as pip running in the env would lay it out
    site = gen / "lib" / "python3.11" / "site-packages"
    assert (site / "tinyarm.py").read_text() == TINY_MODULE
    assert (gen / "bin" / "tinyarm-hello").read_text().splitlines()[0] == f"#!{gen}/bin/python"
    dist = site / "tinyarm-1.0.dist-info"
    assert (dist / "INSTALLER").read_text() == "lingbot-provision\n"
    assert "../../../bin/tinyarm-hello," in (dist / "RECORD").read_text()
    assert not (dist / "direct_url.json").exists()  # from the --find-links mirror by name and version
    assert "byte-compiling" in log and any((site / "__pycache__").glob("tinyarm.cpython-311.pyc"))
    reqs = (gen / "conda-meta" / "lingbot-pip-requirements.txt").read_text()
    assert reqs == f"tinyarm==1.0 --hash=sha256:{locked['sha256']}\n"

    # this checkout, built into a wheel here and installed the same way: its packages are there as files
    (checkout,) = site.glob("lingbot_env-*.dist-info")
    assert json.loads((checkout / "direct_url.json").read_text()) == {"url": REPO.as_uri(), "dir_info": {}}
    for rel in ("provision/wheel_install.py", "provision/templates", "trainer/__init__.py"):
        assert (site / rel).exists(), rel
    code = f"import sys; sys.path.insert(0, {str(site)!r}); import provision.crossarch, tinyarm; " + (
        "print(provision.crossarch.__file__, tinyarm.__file__)"
    )
    imported = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True)
    assert imported.stdout.split() == [str(site / "provision" / "crossarch.py"), str(site / "tinyarm.py")]
    assert (REPO / "build").exists() == had_build, "the checkout's wheel is built from a copy of it"

    # nothing ran inside the env: the host's pip downloaded and built, and the env's python cannot run
    inside = [argv for argv in started if os.path.realpath(argv[0]).startswith(str(gen))]
    assert not inside, inside
    pips = [argv[3] for argv in started if argv[:3] == [sys.executable, "-m", "pip"]]
    assert pips == ["download", "wheel"], started
    (download,) = [argv for argv in started if argv[:4] == [sys.executable, "-m", "pip", "download"]]
    dest = Path(download[download.index("--dest") + 1])  # inside the generation: a kill leaves it there
    assert dest.parent == gen and dest.name.startswith(".lingbot-pip-host-"), download
    try:
        ran = subprocess.run([str(gen / "bin" / "python"), "-c", ""], capture_output=True).returncode
    except OSError as exc:  # no binfmt_misc entry for aarch64 here: Exec format error
        ran = exc.errno
    assert ran != 0, "the stand-in python must not be runnable on this host"


def test_a_wheel_missing_from_the_mirror_fails_naming_it_and_leaves_nothing(root, locked):
    target = root / "envs" / "missing"
    the_plan = install.plan(locked["spec"], "xa", locked["lock"], target, platform=FOREIGN,
                            install_project=False, log=lambda _: None)  # fmt: skip
    empty = root / "empty-wheels"
    empty.mkdir()
    with pytest.raises(ProvisionError) as info:
        install.provision(the_plan, cache_dir=root / "pkgs", pip_find_links=str(empty),
                          progress=install.Progress(enabled=False))  # fmt: skip
    message = str(info.value)
    assert "tinyarm==1.0" in message and f"--find-links {empty}" in message
    assert "--pip-find-links" in message and "the env is untouched" in message
    assert not target.exists() and not any(install.generations_dir(target).iterdir())
    assert not list(root.rglob(".lingbot-pip-host-*")), "the download folder is removed"
