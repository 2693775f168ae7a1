"""bin/provision gives a non-activated job the env's compilers however the spec names them (conda-forge's
`compilers`, `c-compiler`/`cxx-compiler`, `gcc`/`gxx`, `gcc_linux-64`/`gxx_linux-64`) and when a lock is
installed with no spec at all: the variables come from what the linked prefix holds (the toolchain
stand-in's packages, laid out and activated as conda-forge's are), and the job sees exactly what an
activated shell sees."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from provision.envvars import job_environment, load_env_vars
from tests.test_provision import run_cli

pytestmark = pytest.mark.heavy

TARGET = "x86_64-conda-linux-gnu"
VARIANTS = {
    "compilers": ["compilers"],
    "c-compiler": ["c-compiler", "cxx-compiler"],
    "gcc": ["gcc", "gxx"],  # native names: no activation package, the programs only
    "gcc_linux-64": ["gcc_linux-64", "gxx_linux-64"],
}
SHELL_NOISE = {"PWD", "OLDPWD", "SHLVL", "_"}
ACTIVATE = (
    'export CONDA_PREFIX="$1" PATH="$1/bin:$PATH"\nfor s in "$1"/etc/conda/activate.d/*.sh; do . "$s"; done'
)


def write_spec(directory: Path, name: str, channel: Path, deps: list[str]) -> Path:
    spec = directory / "environment.yml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    listed = "\n".join(f"  - {d}" for d in deps)
    spec.write_text(f"name: {name}\nchannels:\n  - {channel}\ndependencies:\n{listed}\n")
    return spec


def compiles_and_runs(job: dict[str, str], work: Path) -> None:
    """The job's CC and CXX (no PATH lookup of gcc) build programs that run."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "a.c").write_text('#include <stdio.h>\nint main(void) { puts("c-ok"); return 0; }\n')
    (work / "b.cpp").write_text('#include <iostream>\nint main() { std::cout << "cxx-ok\\n"; }\n')
    for var, src, exe, said in (("CC", "a.c", "a", "c-ok"), ("CXX", "b.cpp", "b", "cxx-ok")):
        subprocess.run([job[var], str(work / src), "-o", str(work / exe)], env=job, check=True, timeout=120)
        assert subprocess.run([str(work / exe)], capture_output=True, text=True).stdout.strip() == said


def activated(env: Path, base: dict[str, str]) -> dict[str, str]:
    out = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", ACTIVATE + "\nenv -0", "sh", str(env)],
        env=base, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    pairs = (item.split("=", 1) for item in out.split("\0") if item)
    return {k: v for k, v in pairs if k not in SHELL_NOISE and not k.startswith("CONDA_BACKUP_")}


@pytest.fixture(scope="module")
def pkgs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shared-pkgs")  # the toolchain is extracted once for all variants


def cli_env_args(tmp: Path, pkgs: Path) -> Path:
    (tmp / "cache").parent.mkdir(parents=True, exist_ok=True)
    if not (tmp / "cache").exists():
        (tmp / "cache").symlink_to(pkgs)
    return tmp / "envs"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_name_for_the_compilers_gives_a_job_the_compilers(tmp_path, toolchain_channel, pkgs, variant):
    envs = cli_env_args(tmp_path, pkgs)
    spec = write_spec(tmp_path / "project", "cc-env", toolchain_channel, VARIANTS[variant])
    run_cli(["-f", str(spec), "--relock", "-q"], tmp_path, check=True)
    run_cli(["-f", str(spec), "-q"], tmp_path, check=True)
    env = envs / "cc-env"
    stored = load_env_vars(env)
    assert stored["CC"] == f"${{CONDA_PREFIX}}/bin/{TARGET}-cc", stored
    assert stored["CXX"] == f"${{CONDA_PREFIX}}/bin/{TARGET}-c++", stored
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "USER": "tester", "CC": "/usr/bin/gcc"}
    job = job_environment(env, base)
    assert job == activated(env, base)  # exactly what the packages' own activate.d scripts give a shell
    compiles_and_runs(job, tmp_path / "build")
    if variant == "gcc":  # no activation package installed: an activated shell gets no CFLAGS either
        assert "CFLAGS" not in job and "CONDA_BUILD_SYSROOT" not in job
    else:  # conda-forge's activation sets more than CC/CXX
        assert job["CFLAGS"].startswith("-march=nocona") and job["CFLAGS"].endswith(f"-isystem {env}/include")
        assert job["CONDA_BUILD_SYSROOT"] == f"{env}/{TARGET}/sysroot" and job["HOST"] == TARGET
        assert job["CXXFLAGS"].startswith("-march=nocona") and job["LDFLAGS"].endswith(f"-L{env}/lib")


def test_a_lock_installed_without_its_spec(tmp_path, toolchain_channel, pkgs):
    envs = cli_env_args(tmp_path, pkgs)
    spec = write_spec(tmp_path / "project", "cc-env", toolchain_channel, ["compilers"])
    run_cli(["-f", str(spec), "--relock", "-q"], tmp_path, check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(spec.parent / "conda-lock.yml", elsewhere / "conda-lock.yml")  # no environment.yml here
    result = run_cli(
        ["from-lock", "--lockfile", str(elsewhere / "conda-lock.yml"), "-q"], tmp_path, check=True
    )
    env = envs / "from-lock"
    assert "CC" in load_env_vars(env), result.stderr
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "USER": "tester"}
    job = job_environment(env, base)
    assert job == activated(env, base)
    compiles_and_runs(job, tmp_path / "build")


def test_an_env_without_a_compiler_gets_no_compiler_variables(tmp_path, toolchain_channel, pkgs):
    envs = cli_env_args(tmp_path, pkgs)
    spec = write_spec(tmp_path / "project", "bare-env", toolchain_channel, ["lingbot-probe"])
    spec.write_text(spec.read_text() + textwrap.dedent("variables:\n  LINGBOT_GPU_KIND: cpu\n"))
    run_cli(["-f", str(spec), "--relock", "-q"], tmp_path, check=True)
    run_cli(["-f", str(spec), "-q"], tmp_path, check=True)
    assert load_env_vars(envs / "bare-env") == {"LINGBOT_GPU_KIND": "cpu"}
