"""The env's variables: the activate.d/deactivate.d hooks and job_environment() agree, the env's CC
wins, deactivation restores the previous values exactly (unset vs empty), and conda-style activation
(py-rattler's activation script, which sources activate.d) sees the same values."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from provision import hooks
from provision.envvars import EnvVar, EnvVarsError, job_environment, load_env_vars, parse_env_vars

pytestmark = pytest.mark.fast

ENTRIES = [
    EnvVar("set", "CC", "${CONDA_PREFIX}/bin/x86_64-conda-linux-gnu-cc"),
    EnvVar("set", "CXX", "${CONDA_PREFIX}/bin/x86_64-conda-linux-gnu-c++"),
    EnvVar("prepend", "CPATH", "${CONDA_PREFIX}/include"),
    EnvVar("set", "LINGBOT_GPU_KIND", "b200"),
    EnvVar("set", "TRITON_CACHE_DIR", "${HOME}/.triton/cache_lingbot-b200_${LINGBOT_GPU_KIND}"),
]
# Shell bookkeeping that differs between any two shells, not part of the env's variables.
SHELL_NOISE = {"PWD", "OLDPWD", "SHLVL", "_"}

BASES = {
    "nothing set": {},
    "user compilers": {"CC": "/usr/bin/gcc", "CXX": "/usr/bin/g++", "CPATH": "/opt/inc:/usr/local/inc"},
    "empty values": {"CC": "", "CPATH": "", "TRITON_CACHE_DIR": ""},
}


@pytest.fixture
def env_prefix(tmp_path) -> Path:
    prefix = tmp_path / "env"
    (prefix / "bin").mkdir(parents=True)
    hooks.write_env_files(prefix, ENTRIES, "test")
    return prefix


def scrubbed(base: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "USER": "tester", **base}


def shell_env(script: str, env: dict[str, str], *args: str, shell: str = "sh") -> dict[str, str]:
    """The environment left after running `script` in `shell` (sh is dash on Debian: POSIX only)."""
    out = subprocess.run(
        [shell, "-c", script + "\nenv -0", shell, *args], env=env, capture_output=True, check=True
    ).stdout.decode()
    pairs = (item.split("=", 1) for item in out.split("\0") if item)
    return {k: v for k, v in pairs if k not in SHELL_NOISE}


ACTIVATE = (
    'export CONDA_PREFIX="$1"; export PATH="$1/bin:$PATH"; . "$1/etc/conda/activate.d/'
    + hooks.HOOK_NAME
    + '"'
)
DEACTIVATE = '. "$1/etc/conda/deactivate.d/' + hooks.HOOK_NAME + '"; unset CONDA_PREFIX; PATH="$2"'


@pytest.mark.parametrize("case", sorted(BASES))
def test_sourcing_the_hook_equals_job_environment(env_prefix, tmp_path, case):
    base = scrubbed(BASES[case], tmp_path)
    activated = shell_env(ACTIVATE, base, str(env_prefix))
    activated = {k: v for k, v in activated.items() if not k.startswith("CONDA_BACKUP_LINGBOT_")}
    assert activated == job_environment(env_prefix, base)
    assert activated["CC"] == f"{env_prefix}/bin/x86_64-conda-linux-gnu-cc"  # the user's CC never wins
    old_cpath = base.get("CPATH")
    assert activated["CPATH"] == f"{env_prefix}/include" + (f":{old_cpath}" if old_cpath else "")
    assert activated["TRITON_CACHE_DIR"] == f"{tmp_path}/home/.triton/cache_lingbot-b200_b200"
    assert not Path(activated["TRITON_CACHE_DIR"]).exists()  # exported, never created by the hook


@pytest.mark.parametrize("case", sorted(BASES))
def test_deactivation_restores_previous_values_exactly(env_prefix, tmp_path, case):
    base = scrubbed(BASES[case], tmp_path)
    after = shell_env(ACTIVATE + "\n" + DEACTIVATE, base, str(env_prefix), base["PATH"])
    assert after == shell_env(":", base)  # unset stays unset, empty stays empty, values come back


def test_rattler_activation_sources_the_hook(env_prefix, tmp_path):
    from rattler.shell import ActivationVariables, PathModificationBehavior, Shell, activate

    base = scrubbed(BASES["user compilers"], tmp_path)
    result = activate(
        env_prefix,
        ActivationVariables(None, base["PATH"].split(":"), PathModificationBehavior.Prepend),
        Shell.bash,
        platform="linux-64",
    )
    activated = shell_env(result.script, base, shell="bash")  # what `conda activate` would leave
    expected = job_environment(env_prefix, base)
    for name in ("CC", "CXX", "CPATH", "TRITON_CACHE_DIR", "CONDA_PREFIX"):
        assert activated[name] == expected[name], name
    assert activated["PATH"].split(":")[0] == f"{env_prefix}/bin"


def test_hooks_are_shellcheck_clean():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    templates = sorted(str(p) for p in hooks.TEMPLATES.glob("*.sh"))
    result = subprocess.run(["shellcheck", "--shell=sh", *templates], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_load_env_vars_and_strict_grammar(env_prefix):
    stored = load_env_vars(env_prefix)
    assert stored["CPATH"] == "${CONDA_PREFIX}/include" and list(stored)[:2] == ["CC", "CXX"]
    with pytest.raises(EnvVarsError, match=r"x:2: expected"):
        parse_env_vars("set A b\nbroken\n", "x")
    with pytest.raises(EnvVarsError, match="must be non-empty plain text"):
        parse_env_vars('set A "quoted"\n', "x")
    with pytest.raises(FileNotFoundError, match="bin/provision"):
        job_environment(env_prefix.parent / "missing", dict(os.environ))
