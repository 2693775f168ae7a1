"""The computed variables come from what the linked prefix holds (provision/activation.py): the packages'
own activate.d scripts, captured in a clean bash, and CC/CXX from the installed `<triplet>-cc`/`-c++`.
A non-activated job (job_environment) then sees what an activated shell sees, and deactivation
restores the caller's values. Prefixes here are made by hand (conda-meta records + files), with the
toolchain stand-in's own activation scripts (tests/support/toolchain.py, conda-forge's shape)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from provision import activation, hooks
from provision.envvars import EnvVar, job_environment
from tests.support.toolchain import ACTIVATION, TARGET, _activation

pytestmark = pytest.mark.fast

# bash-isms as conda-forge's scripts have them (`function`, local), a PATH prepend, a default
BASHISH = """\
function _lingbot_demo() {
  local tool=$1
  export DEMO_TOOL="${CONDA_PREFIX}/bin/${tool}"
  if [ -n "${DEMO_LEVEL+x}" ]; then export CONDA_BACKUP_DEMO_LEVEL="${DEMO_LEVEL}"; fi
  export DEMO_LEVEL="${DEMO_LEVEL:-3}"
  export PATH="${CONDA_PREFIX}/libexec/demo:${PATH}"
  export DEMO_CACHE="${HOME}/.cache/demo-${USER}"
}
_lingbot_demo demo-tool
unset -f _lingbot_demo
"""
BASHISH_OFF = """\
unset DEMO_TOOL DEMO_CACHE DEMO_LEVEL
if [ -n "${CONDA_BACKUP_DEMO_LEVEL+x}" ]; then export DEMO_LEVEL="${CONDA_BACKUP_DEMO_LEVEL}"; fi
unset CONDA_BACKUP_DEMO_LEVEL
export PATH="${PATH#"${CONDA_PREFIX}"/libexec/demo:}"
"""
SHELL_NOISE = {"PWD", "OLDPWD", "SHLVL", "_"}


def make_prefix(root: Path, packages: dict[str, dict[str, str]], stray: tuple[str, ...] = ()) -> Path:
    """A linked-looking prefix: each package's files written and listed in its conda-meta record."""
    prefix = root / "env"
    (prefix / "conda-meta").mkdir(parents=True)
    for name, files in packages.items():
        for rel, text in files.items():
            path = prefix / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if text.startswith("#!"):
                path.chmod(0o755)
        record = {"name": name, "version": "1", "build": "0", "files": sorted(files)}
        (prefix / "conda-meta" / f"{name}-1-0.json").write_text(json.dumps(record))
    for rel in stray:  # files no record lists
        (prefix / rel).parent.mkdir(parents=True, exist_ok=True)
        (prefix / rel).write_text("#!/bin/sh\n")
        (prefix / rel).chmod(0o755)
    return prefix


def tools(*names: str) -> dict[str, str]:
    return {f"bin/{TARGET}-{n}": "#!/bin/sh\necho stand-in\n" for n in names}


def scripts(package: str) -> dict[str, str]:
    return {rel: text.decode() for rel, text in _activation(package, *ACTIVATION[package]).items()}


GCC_TOOLS = ("cc", "cpp", "gcc", "gcc-ar", "gcc-nm", "gcc-ranlib")
BINUTILS = ("addr2line", "ar", "as", "c++filt", "elfedit", "ld", "nm", "objcopy", "objdump", "ranlib",
            "readelf", "size", "strings", "strip")  # fmt: skip


@pytest.fixture
def conda_forge_like(tmp_path) -> Path:
    """gcc_linux-64/gxx_linux-64/binutils_linux-64 (activation only) over *_impl (programs), plus a
    package with a bash-only script."""
    return make_prefix(
        tmp_path,
        {
            "binutils_impl_linux-64": tools(*BINUTILS),
            "gcc_impl_linux-64": tools(*GCC_TOOLS),
            "gxx_impl_linux-64": tools("c++", "g++"),
            "binutils_linux-64": scripts("binutils_linux-64"),
            "gcc_linux-64": scripts("gcc_linux-64"),
            "gxx_linux-64": scripts("gxx_linux-64"),
            "demo": {
                "etc/conda/activate.d/demo_activate.sh": BASHISH,
                "etc/conda/deactivate.d/demo_deactivate.sh": BASHISH_OFF,
            },
        },
    )


def provisioned(prefix: Path, spec: list[EnvVar] | None = None) -> list[EnvVar]:
    entries = activation.env_entries(prefix, "linux-64", spec or [], "test", log=lambda _: None)
    hooks.write_env_files(prefix, entries, "test")
    return entries


def test_captured_modes_and_references(conda_forge_like):
    entries = {e.name: e for e in provisioned(conda_forge_like, [EnvVar("set", "HOST", "mine")])}
    assert entries["CC"] == EnvVar("set", "CC", f"${{CONDA_PREFIX}}/bin/{TARGET}-cc")
    assert entries["CXX"] == EnvVar("set", "CXX", f"${{CONDA_PREFIX}}/bin/{TARGET}-c++")
    assert entries["CPATH"] == EnvVar("prepend", "CPATH", "${CONDA_PREFIX}/include")
    assert entries["CFLAGS"].mode == "default" and entries["CFLAGS"].value.endswith(
        "-isystem ${CONDA_PREFIX}/include"
    )
    assert entries["CXXFLAGS"].mode == "default" and "-std=c++17" in entries["CXXFLAGS"].value
    assert (
        entries["LDFLAGS"].mode == "default" and "-Wl,-rpath,${CONDA_PREFIX}/lib" in entries["LDFLAGS"].value
    )
    assert entries["CONDA_BUILD_SYSROOT"] == EnvVar(
        "set", "CONDA_BUILD_SYSROOT", f"${{CONDA_PREFIX}}/{TARGET}/sysroot"
    )
    assert entries["BUILD"].value == entries["build_alias"].value == TARGET
    assert entries["AR"].value == f"${{CONDA_PREFIX}}/bin/{TARGET}-ar"
    assert entries["HOST"] == EnvVar("set", "HOST", "mine")  # the spec's variables win, as in a shell
    assert entries["PATH"] == EnvVar("prepend", "PATH", "${CONDA_PREFIX}/libexec/demo")
    assert entries["DEMO_LEVEL"] == EnvVar("default", "DEMO_LEVEL", "3")
    assert entries["DEMO_CACHE"].value == "${HOME}/.cache/demo-${USER}"
    assert "CONDA_BUILD_CROSS_COMPILATION" not in entries  # the script unsets it: nothing to set
    assert not any(name.startswith("CONDA_BACKUP_") for name in entries)
    # the computed ones come after what they replace, the spec's last
    assert list(entries)[-1] == "HOST"


BASES = {
    "nothing set": {},
    "user values": {"CC": "/usr/bin/gcc", "CFLAGS": "-O0 -g", "CPATH": "/opt/inc", "DEMO_LEVEL": "9"},
    "empty values": {"CC": "", "CPATH": "", "LDFLAGS": ""},
}


def shell_env(script: str, env: dict[str, str], prefix: Path) -> dict[str, str]:
    out = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", script + "\nenv -0", "sh", str(prefix)],
        env=env, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    pairs = (item.split("=", 1) for item in out.split("\0") if item)
    return {k: v for k, v in pairs if k not in SHELL_NOISE}


# what `conda activate` does around the hooks: CONDA_PREFIX, the env's bin on PATH, activate.d in order
ACTIVATE = (
    'export CONDA_PREFIX="$1" PATH="$1/bin:$PATH"\nfor s in "$1"/etc/conda/activate.d/*.sh; do . "$s"; done'
)
DEACTIVATE = (
    'for s in $(ls -r "$1"/etc/conda/deactivate.d/*.sh); do . "$s"; done\n'
    'unset CONDA_PREFIX\nPATH=${PATH#"$1"/bin:}'
)


@pytest.mark.parametrize("case", sorted(BASES))
def test_a_job_sees_what_an_activated_shell_sees(conda_forge_like, tmp_path, case):
    provisioned(conda_forge_like, [EnvVar("set", "LINGBOT_GPU_KIND", "cpu")])
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "USER": "tester", **BASES[case]}
    activated = shell_env(ACTIVATE, base, conda_forge_like)
    activated = {k: v for k, v in activated.items() if not k.startswith("CONDA_BACKUP_")}
    assert activated == job_environment(conda_forge_like, base)
    assert activated["CC"] == f"{conda_forge_like}/bin/{TARGET}-cc"  # the user's CC never wins
    assert activated["CFLAGS"] == BASES[case].get("CFLAGS") or activated["CFLAGS"].startswith("-march=nocona")
    assert activated["PATH"] == f"{conda_forge_like}/libexec/demo:{conda_forge_like}/bin:/usr/bin:/bin"
    assert activated["DEMO_CACHE"] == f"{tmp_path}/home/.cache/demo-tester"


@pytest.mark.parametrize("case", ["nothing set", "user values"])
def test_deactivation_restores_the_callers_values(conda_forge_like, tmp_path, case):
    provisioned(conda_forge_like)
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "USER": "tester", **BASES[case]}
    assert shell_env(ACTIVATE + "\n" + DEACTIVATE, base, conda_forge_like) == shell_env(
        ":", base, conda_forge_like
    )


def test_compilers_without_activation_scripts_still_get_cc(tmp_path):
    """`gcc`/`gxx` (native names) pull only the *_impl programs: no script sets CC, the prefix has it."""
    prefix = make_prefix(
        tmp_path, {"gcc_impl_linux-64": tools(*GCC_TOOLS), "gxx_impl_linux-64": tools("c++")}
    )
    names = [e.name for e in provisioned(prefix)]
    assert names == ["CC", "CXX", "CPATH"]
    assert job_environment(prefix, {"PATH": "/usr/bin"})["CXX"] == f"{prefix}/bin/{TARGET}-c++"


def test_no_compiler_no_compiler_variables(tmp_path):
    # a stray <triplet>-cc that no installed record lists is not the env's compiler
    prefix = make_prefix(tmp_path, {"python": {"bin/python3": "#!/bin/sh\n"}}, stray=(f"bin/{TARGET}-cc",))
    assert provisioned(prefix, [EnvVar("set", "A", "b")]) == [EnvVar("set", "A", "b")]
    job = job_environment(prefix, {"PATH": "/usr/bin", "HOME": "/h"})
    assert "CC" not in job and "CXX" not in job and "CPATH" not in job
    # a script without the programs it promises sets nothing (and says so), as conda-forge's do
    prefix = make_prefix(tmp_path / "b", {"gcc_linux-64": scripts("gcc_linux-64")})
    said: list[str] = []
    assert activation.env_entries(prefix, "linux-64", [], "test", log=said.append) == []
    assert "ERROR: gcc_linux-64" in said[0]


@pytest.mark.parametrize(
    "body, expected",
    [
        ('export ODD="a\\"b"', "must be non-empty plain text"),
        ("export EMPTY=", "EMPTY to an empty value"),
        ('export LIST="${LIST:+$LIST:}extra"', "can only set, default or prepend"),
        ("unset LANG", "LANG becomes None"),
    ],
)
def test_what_env_vars_cannot_hold_stops_the_provision(tmp_path, body, expected):
    prefix = make_prefix(tmp_path, {"odd": {"etc/conda/activate.d/odd.sh": body + "\n"}})
    with pytest.raises(activation.ActivationError, match=expected) as info:
        activation.env_entries(prefix, "linux-64", [], "test", log=lambda _: None)
    assert "etc/conda/activate.d/odd.sh" in str(info.value)


def test_capture_runs_without_the_callers_environment(conda_forge_like, monkeypatch):
    """What the provisioning shell has (a CFLAGS, a compiler on PATH) does not leak into env-vars."""
    monkeypatch.setenv("CFLAGS", "-O0 -from-the-login-node")
    monkeypatch.setenv("DEMO_LEVEL", "7")
    entries = {e.name: e for e in provisioned(conda_forge_like)}
    assert "-from-the-login-node" not in entries["CFLAGS"].value and entries["DEMO_LEVEL"].value == "3"
    assert os.environ["CFLAGS"] == "-O0 -from-the-login-node"
