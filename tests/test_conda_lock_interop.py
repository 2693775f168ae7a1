"""bin/provision and conda-lock's own files and CLI.

- The committed environment.yml + virtual-packages.yml + conda-lock.yml are current by conda-lock's
  CLI: exactly `conda-lock lock --check-input-hash -f environment.yml --virtual-package-spec
  virtual-packages.yml --lockfile conda-lock.yml`, offline, without a solve.
- A lock written the way conda-lock 4.0.3 writes it (its v2 model through its v1 writer: no
  bin/provision metadata, a package in two categories appearing twice, content hash by conda-lock
  with its default virtual packages) installs, with drift judged by conda-lock's rule and the message
  saying which virtual packages were assumed; no spec at hand installs with a warning; unknown
  managers and platforms, and a name in both parts, are refused naming them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provision import prefix as prefixes
from provision.lock import LockError, check_lock
from provision.spec import load_spec
from tests.support.channel import index_channel, make_package

REPO = Path(__file__).resolve().parents[1]
CONDA_LOCK = Path(sys.executable).parent / "conda-lock"

TRIPWIRE = """#!/bin/sh
# A `conda` that conda-lock finds on PATH (it insists on one before it checks the hash): answers
# --version, and records and fails anything else, so a solve cannot go unnoticed.
if [ "$1" = "--version" ]; then echo "conda 24.9.2"; exit 0; fi
echo "$*" >> "$(dirname "$0")/invoked"
echo "tripwire conda: $*" >&2
exit 1
"""


def conda_lock_offline_env(tmp: Path) -> dict[str, str]:
    """conda-lock's environment offline: a tripwire conda on PATH, and its PyPI->conda name map (which
    it downloads from GitHub when parsing a spec with a pip part) seeded into its own cache as the
    identity map (the map only renames the conda-side `pip` dependency, to itself)."""
    from conda_lock.lookup import DEFAULT_MAPPING_URL
    from conda_lock.lookup_cache import cached_filename_for_url

    bindir = tmp / "tripwire-bin"
    bindir.mkdir()
    (bindir / "conda").write_text(TRIPWIRE)
    (bindir / "conda").chmod(0o755)
    cache = tmp / "xdg-cache"
    mapping = cache / "conda-lock" / "cache" / "pypi-mapping" / cached_filename_for_url(DEFAULT_MAPPING_URL)
    mapping.parent.mkdir(parents=True)
    mapping.write_text("{}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONDA", "MAMBA"))}
    return {**env, "PATH": f"{bindir}:{env['PATH']}", "XDG_CACHE_HOME": str(cache)}


def offline(argv: list[str]) -> list[str]:
    """`argv` in a network namespace with no interfaces (root), else as is."""
    if os.geteuid() == 0 and shutil.which("unshare"):
        probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
        if probe.returncode == 0:
            return ["unshare", "-n", *argv]
    return argv


@pytest.mark.heavy
def test_conda_lock_cli_says_the_committed_lock_is_current(tmp_path):
    work = tmp_path / "checkout"
    work.mkdir()
    for name in ("environment.yml", "virtual-packages.yml", "conda-lock.yml"):
        shutil.copy(REPO / name, work / name)
    env = conda_lock_offline_env(tmp_path)
    argv = [
        str(CONDA_LOCK),
        "lock",
        "--check-input-hash",
        "-f",
        "environment.yml",
        "--virtual-package-spec",
        "virtual-packages.yml",
        "--lockfile",
        "conda-lock.yml",
    ]
    proc = subprocess.run(offline(argv), cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # both platforms, each hash of conda-lock's own parse of the selectors (# [linux64], # [aarch64])
    assert (
        "Spec hash already locked for ['linux-64', 'linux-aarch64']. Skipping solve."
        in proc.stdout + proc.stderr
    )
    assert not (tmp_path / "tripwire-bin" / "invoked").exists(), "conda-lock ran a solve"
    assert (work / "conda-lock.yml").read_bytes() == (REPO / "conda-lock.yml").read_bytes()
    # and a changed spec is not current by the same command: it wants to solve (the tripwire fires)
    text = (work / "environment.yml").read_text().replace("  - pip\n", "  - pip\n  - make\n", 1)
    (work / "environment.yml").write_text(text)
    changed = subprocess.run(offline(argv), cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert changed.returncode != 0
    assert (tmp_path / "tripwire-bin" / "invoked").exists()


# --- a lock as conda-lock writes it ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_channel(tmp_path_factory) -> Path:
    channel = tmp_path_factory.mktemp("interop-channel")
    make_package(channel / "linux-64", "alpha", "1.0", {"share/alpha.txt": b"alpha\n"}, depends=["beta >=2"])
    make_package(channel / "noarch", "beta", "2.1", {"share/beta.txt": b"beta\n"}, noarch="generic")
    index_channel(channel)
    return channel


def _records(channel: Path) -> list[dict]:
    out = []
    for subdir in ("linux-64", "noarch"):
        data = json.loads((channel / subdir / "repodata.json").read_text())
        for key in ("packages", "packages.conda"):
            for file_name, rec in (data.get(key) or {}).items():
                out.append({**rec, "url": f"{channel.as_uri()}/{subdir}/{file_name}"})
    return out


def conda_lock_hash(spec: Path, platform: str = "linux-64") -> str:
    """conda-lock's content hash of `spec` exactly as `conda-lock lock -f spec` computes it without
    --virtual-package-spec: its parser, its default virtual packages."""
    from conda_lock.content_hash import compute_content_hashes
    from conda_lock.src_parser import make_lock_spec
    from conda_lock.virtual_package import default_virtual_package_repodata

    mapping = spec.parent / "mapping.json"
    mapping.write_text("{}")
    lock_spec = make_lock_spec(src_files=[spec], platform_overrides=[platform], mapping_url=str(mapping))
    return compute_content_hashes(lock_spec, default_virtual_package_repodata())[platform]


def write_conda_lock_style(spec: Path, channel: Path, lock_path: Path) -> None:
    """conda-lock's make_lock_files path after its solve: v2 model, v1 writer, no --md choices."""
    from conda_lock.lockfile import write_conda_lock_file
    from conda_lock.lockfile.v1.models import LockMeta
    from conda_lock.lockfile.v2prelim.models import HashModel, LockedDependency, Lockfile
    from conda_lock.models.channel import Channel

    packages = [
        LockedDependency(
            name=r["name"],
            version=r["version"],
            manager="conda",
            platform="linux-64",
            dependencies={d.split()[0]: (d.split(" ", 1)[1:] or [""])[0] for d in r.get("depends", [])},
            url=r["url"],
            hash=HashModel(md5=r["md5"], sha256=r["sha256"]),
            build=r["build"],
            categories={"main", "dev"} if r["name"] == "beta" else {"main"},
        )
        for r in _records(channel)
    ]
    meta = LockMeta(
        content_hash={"linux-64": conda_lock_hash(spec)},
        channels=[Channel.from_string(channel.as_uri())],
        platforms=["linux-64"],
        sources=[spec.name],
    )
    write_conda_lock_file(Lockfile(package=packages, metadata=meta), lock_path, metadata_choices=None)


def make_project(tmp: Path, channel: Path) -> tuple[Path, Path]:
    spec = tmp / "project" / "environment.yml"
    spec.parent.mkdir(parents=True)
    spec.write_text(f"name: tiny-env\nchannels:\n  - {channel.as_uri()}\ndependencies:\n  - alpha\n")
    lock = spec.parent / "conda-lock.yml"
    write_conda_lock_style(spec, channel, lock)
    return spec, lock


def run_cli(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONDA_ENVS_PATH": str(tmp / "envs"), "LINGBOT_PKGS_DIR": str(tmp / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "provision.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.fast
def test_conda_lock_written_lock_has_its_shape(tmp_path, tiny_channel):
    _, lock = make_project(tmp_path, tiny_channel)
    data = yaml.safe_load(lock.read_text())
    assert data["version"] == 1 and "custom_metadata" not in data["metadata"]
    assert "inputs_metadata" not in data["metadata"]
    betas = [p for p in data["package"] if p["name"] == "beta"]
    assert sorted(p["category"] for p in betas) == ["dev", "main"]  # v1 from the v2 model: one per category
    assert [p["optional"] for p in sorted(betas, key=lambda p: p["category"])] == [True, False]


@pytest.mark.heavy
def test_conda_lock_written_lock_installs_with_the_drift_rule_named(tmp_path, tiny_channel):
    spec, lock = make_project(tmp_path, tiny_channel)
    proc = run_cli(["tiny-env", "-f", str(spec), "--lockfile", str(lock), "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "conda-lock content hash with conda-lock's default virtual packages (the lock records none)" in (
        proc.stderr
    )
    result = json.loads(proc.stdout)  # --json: exactly one JSON object on stdout
    assert result["ok"] and result["action"] == "provisioned" and result["packages"] == 2
    prefix = tmp_path / "envs" / "tiny-env"
    assert prefixes.completeness(prefix) == (True, "")
    assert (prefix / "share" / "alpha.txt").read_text() == "alpha\n"
    assert sorted(p["name"] for p in prefixes.read_manifest(prefix)["packages"]) == ["alpha", "beta"]

    # drift by conda-lock's rule: a new dependency is refused, and the message says what was assumed
    spec.write_text(spec.read_text() + "  - beta >=2\n")
    with pytest.raises(LockError, match="drift") as info:
        check_lock(load_spec(spec), lock, "linux-64", log=lambda _: None)
    assert "conda-lock's default virtual packages (the lock records none)" in str(info.value)


@pytest.mark.fast
def test_lock_without_a_spec_installs_with_a_warning(tmp_path, tiny_channel):
    _, lock = make_project(tmp_path, tiny_channel)
    alone = tmp_path / "alone" / "conda-lock.yml"
    alone.parent.mkdir()
    shutil.copy(lock, alone)  # metadata.sources names environment.yml, which is not beside it
    proc = run_cli(["tiny-env", "--lockfile", str(alone), "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: no environment.yml" in proc.stderr and "drift cannot be checked" in proc.stderr
    result = json.loads(proc.stdout)
    assert result["ok"] and "drift was not checked" in result["warning"]
    assert prefixes.completeness(tmp_path / "envs" / "tiny-env") == (True, "")
    nameless = run_cli(["--lockfile", str(alone)], tmp_path)
    assert nameless.returncode == 2 and "name the env" in nameless.stderr


@pytest.mark.fast
@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda p: p.update(manager="npm"), "unknown manager 'npm'"),
        (lambda p: p.update(platform="osx-arm64"), "platform 'osx-arm64' is not one of metadata.platforms"),
    ],
)
def test_unknown_manager_or_platform_is_refused_naming_it(tmp_path, tiny_channel, edit, message):
    spec, lock = make_project(tmp_path, tiny_channel)
    data = yaml.safe_load(lock.read_text())
    alpha = next(p for p in data["package"] if p["name"] == "alpha")
    edit(alpha)
    lock.write_text(yaml.safe_dump(data))
    proc = run_cli(["tiny-env", "-f", str(spec), "--lockfile", str(lock)], tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr and "(alpha)" in proc.stderr and str(lock) in proc.stderr
    assert not (tmp_path / "envs" / "tiny-env").exists()


@pytest.mark.fast
def test_a_name_in_both_parts_is_refused_naming_it(tmp_path, tiny_channel):
    spec, lock = make_project(tmp_path, tiny_channel)
    data = yaml.safe_load(lock.read_text())
    data["package"].append(
        {
            "name": "beta",
            "version": "3.0",
            "manager": "pip",
            "platform": "linux-64",
            "dependencies": {},
            "url": "https://files.example/beta-3.0-py3-none-any.whl",
            "hash": {"sha256": "0" * 64},
            "category": "main",
            "optional": False,
        }
    )
    lock.write_text(yaml.safe_dump(data))
    proc = run_cli(["tiny-env", "-f", str(spec), "--lockfile", str(lock)], tmp_path)
    assert proc.returncode == 2
    assert "locks beta in both the conda and the pip part" in proc.stderr and "--relock" in proc.stderr


def _lock_edit(data: dict, case: str) -> None:
    alpha = next(p for p in data["package"] if p["name"] == "alpha")
    if case == "hash":
        alpha["hash"] = "abc"
    elif case == "categories":
        alpha["categories"] = "main"  # a string: read letter by letter, alpha would be skipped
    elif case == "content_hash":
        data["metadata"]["content_hash"] = ["x"]
    elif case == "custom_metadata":
        data["metadata"]["custom_metadata"] = "x"
    elif case == "platforms":
        data["metadata"]["platforms"] = "linux-64"


@pytest.mark.fast
@pytest.mark.parametrize(
    "case, key",
    [
        ("hash", "package[0] (alpha) hash must be a mapping"),
        ("categories", "(alpha): categories must be a list"),
        ("content_hash", "metadata.content_hash must be a mapping"),
        ("custom_metadata", "metadata.custom_metadata must be a mapping"),
        ("platforms", "metadata.platforms must be a list"),
        ("yaml", "malformed YAML"),
    ],
)
def test_a_lock_with_a_wrong_typed_key_is_one_line_naming_it(tmp_path, tiny_channel, case, key):
    """Found by a review: each of these was an AttributeError traceback (exit 1), or (categories) an env
    installed without the package; the malformed YAML one only when the lock came without --file."""
    _, lock = make_project(tmp_path, tiny_channel)
    data = yaml.safe_load(lock.read_text())
    data["package"] = sorted(data["package"], key=lambda p: p["name"] != "alpha")
    _lock_edit(data, case)
    lock.write_text(yaml.safe_dump(data) + ("oops: [\n" if case == "yaml" else ""))
    proc = run_cli(["tiny-env", "--lockfile", str(lock), "--json"], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert key in proc.stderr and str(lock) in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)["ok"] is False
    assert not (tmp_path / "envs" / "tiny-env").exists()


@pytest.mark.fast
def test_a_spec_and_a_name_that_cannot_be_used_are_refused_and_a_nameless_spec_takes_the_name(
    tmp_path, tiny_channel
):
    spec, lock = make_project(tmp_path, tiny_channel)
    text = spec.read_text()
    bad = {
        "latin1.yml": (text.encode() + b"# caf\xe9\n", "not UTF-8 text"),
        "string-deps.yml": (
            text.split("dependencies:")[0].encode() + b"dependencies: alpha\n",
            "must be a list",
        ),
    }
    for name, (body, line) in bad.items():
        path = spec.parent / name
        path.write_bytes(body)
        proc = run_cli(["tiny-env", "-f", str(path), "--lockfile", str(lock)], tmp_path)
        assert proc.returncode == 2 and line in proc.stderr and str(path) in proc.stderr, proc.stderr
    for name in ("../escaped", "a/b", "x:y", "a b"):  # no spec at hand: the NAME alone names the folder
        alone = tmp_path / "alone"
        alone.mkdir(exist_ok=True)
        shutil.copy(lock, alone / "conda-lock.yml")
        proc = run_cli([name, "--lockfile", str(alone / "conda-lock.yml")], tmp_path)
        assert proc.returncode == 2 and "env name" in proc.stderr, (name, proc.stderr)
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "envs").exists()
    spec.write_text(text.replace("name: tiny-env\n", ""))  # conda-lock's environment.yml need not name it
    proc = run_cli(["tiny-env", "--lockfile", str(lock), "-q"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert prefixes.completeness(tmp_path / "envs" / "tiny-env") == (True, "")
    unnamed = run_cli(["--lockfile", str(lock)], tmp_path)
    assert unnamed.returncode == 2 and "no `name:`" in unnamed.stderr, unnamed.stderr


@pytest.mark.fast
def test_a_symlink_the_user_made_at_the_env_path_is_never_repointed(tmp_path, tiny_channel):
    spec, lock = make_project(tmp_path, tiny_channel)
    for name, points_to in (("linked", tmp_path / "elsewhere"), ("dangling", tmp_path / "gone")):
        (tmp_path / "elsewhere").mkdir(exist_ok=True)
        link = tmp_path / name
        link.symlink_to(points_to)
        proc = run_cli(
            ["tiny-env", "-f", str(spec), "--lockfile", str(lock), "--prefix", str(link)], tmp_path
        )
        assert proc.returncode == 2 and "a symlink to" in proc.stderr and f"rm {link}" in proc.stderr, (
            proc.stderr
        )
        assert os.readlink(link) == str(points_to)
    ours = tmp_path / "ours"  # bin/provision's own link is updated as before (a re-provision is a no-op)
    for _ in range(2):
        proc = run_cli(
            ["tiny-env", "-f", str(spec), "--lockfile", str(lock), "--prefix", str(ours)], tmp_path
        )
        assert proc.returncode == 0, proc.stderr


@pytest.mark.fast
def test_a_json_file_that_cannot_be_written_is_not_exit_0(tmp_path, tiny_channel):
    spec, lock = make_project(tmp_path, tiny_channel)
    folder = tmp_path / "a-folder"
    folder.mkdir()
    proc = run_cli(
        ["tiny-env", "-f", str(spec), "--lockfile", str(lock), "--json-file", str(folder)], tmp_path
    )
    assert proc.returncode == 1 and f"could not write --json-file {folder}" in proc.stderr, proc.stderr


@pytest.mark.fast
def test_a_full_disk_while_linking_is_one_line_and_no_env(tmp_path, tiny_channel):
    """The env's folder on a 64 KiB tmpfs (a mount namespace of its own, root): rattler's link error was a
    traceback (exit 1); it is one line naming the env's folder, exit 2, and nothing counts as the env."""
    if os.geteuid() != 0 or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.fail("needs root and `unshare -m` (this suite's hosts have both)")
    bulk = {f"share/bulk/f{i}.txt": b"x" * 8192 for i in range(32)}  # 256 KiB
    make_package(tiny_channel / "noarch", "bulk", "1.0", bulk, noarch="generic")
    index_channel(tiny_channel)
    spec = tmp_path / "project" / "environment.yml"
    spec.parent.mkdir(parents=True)
    spec.write_text(f"name: full-env\nchannels:\n  - {tiny_channel.as_uri()}\ndependencies:\n  - bulk\n")
    write_conda_lock_style(spec, tiny_channel, spec.parent / "conda-lock.yml")
    small = tmp_path / "small"
    small.mkdir()
    env = {**os.environ, "LINGBOT_PKGS_DIR": str(tmp_path / "cache")}
    script = f'mount -t tmpfs -o size=64k tmpfs {small} && exec "$@"'
    argv = [sys.executable, "-m", "provision.cli", "-f", str(spec), "--prefix", str(small / "env")]
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "linking the conda packages into" in proc.stderr and "No space left on device" in proc.stderr


@pytest.mark.fast
def test_an_unknown_platform_and_a_prefix_under_a_file_are_named_with_their_fix(tmp_path, tiny_channel):
    spec, lock = make_project(tmp_path, tiny_channel)
    afile = tmp_path / "a-file"
    afile.write_text("")
    for flags, said in (
        (["--platform", "foo"], "--platform foo: not a conda platform this tool knows"),  # not "add foo to"
        (["--prefix", str(afile / "env")], f"{afile} is a file, so the env's folder cannot be made there"),
    ):
        proc = run_cli(["tiny-env", "-f", str(spec), "--lockfile", str(lock), *flags], tmp_path)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
