"""The toolchain stand-in, installed by py-rattler from a local channel, builds code on a worker.

This is the claim the project makes for conda-forge's gcc_linux-64/gxx_linux-64: an env that
carries its own compiler lets Triton and TorchInductor compile where the machine has none.

Here: Triton's C extension build in both relocated prefixes, and direct C, C++ and `-fopenmp` builds,
inside the worker simulation. TorchInductor's half (an OpenMP C++ kernel built by the env's compiler, with
the env's openssl for the precompiled header) is held by tests/test_envcheck.py, through the product path
(CC/CXX from the env's variables file): test_worker_with_toolchain_passes_not_activated (compile.inductor_cpp
PASS: `#pragma omp parallel`, GOMP in the kernel's .so, max error < 1e-3, compiler in the env; the env's
openssl) and test_worker_with_toolchain_passes_activated (the same row with `--fast`, activated). The test
that compiled it here with CC/CXX set by hand, test_torch_compile_openmp_inside_worker, was removed for that.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.channel import PREFIX_PLACEHOLDER, make_package, solve_and_install

PYTHON = sys.executable
TARGET = "x86_64-conda-linux-gnu"
# torch's wheel ships libgomp.so.1 here; ubuntu:22.04 workers have no system copy.
_TORCH = importlib.util.find_spec("torch")
assert _TORCH is not None and _TORCH.submodule_search_locations is not None
TORCH_LIB = Path(_TORCH.submodule_search_locations[0]) / "lib"

C_EXTENSION = textwrap.dedent("""
    #include <Python.h>
    #include <math.h>
    #include <stdio.h>
    static PyObject *hypot2(PyObject *self, PyObject *args) {
        double a, b;
        if (!PyArg_ParseTuple(args, "dd", &a, &b)) return NULL;
        char buf[64];
        snprintf(buf, sizeof buf, "%.1f", sqrt(a * a + b * b));
        return PyUnicode_FromString(buf);
    }
    static PyMethodDef methods[] = {{"hypot2", hypot2, METH_VARARGS, NULL}, {NULL, NULL, 0, NULL}};
    static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "lingbot_cext", NULL, -1, methods};
    PyMODINIT_FUNC PyInit_lingbot_cext(void) { return PyModule_Create(&mod); }
""")

TRITON_BUILD = textwrap.dedent(f"""
    import os
    from triton.runtime.build import compile_module_from_src
    mod = compile_module_from_src({C_EXTENSION!r}, "lingbot_cext", libraries=["m"])
    print(mod.hypot2(3.0, 4.0), os.path.realpath(mod.__file__))
""")


@pytest.fixture(scope="module")
def toolchain_prefixes(toolchain_channel, tmp_path_factory) -> list[Path]:
    """The stand-in installed into two unrelated prefixes (relocation), as provisioning would."""
    root = tmp_path_factory.mktemp("toolchain-envs")
    prefixes = [root / "a" / "env", root / "b" / "much" / "deeper" / "env"]
    records = solve_and_install(
        toolchain_channel,
        ["gcc_linux-64", "gxx_linux-64", "lingbot-probe"],
        prefixes,
        cache_dir=root / "cache",
    )
    assert {r.name.normalized for r in records} >= {
        "gcc_linux-64", "gxx_linux-64", "gcc_impl_linux-64", "gxx_impl_linux-64",
        "binutils_impl_linux-64", "binutils_linux-64", "sysroot_linux-64", "lingbot-probe",
    }  # fmt: skip
    return prefixes


def compiler_env(worker_env: dict[str, str], prefix: Path) -> dict[str, str]:
    # No LD_LIBRARY_PATH: the built modules' libgomp.so.1 is satisfied by the copy torch already
    # loaded from torch/lib (same SONAME), as on a real worker.
    return dict(worker_env, CC=f"{prefix}/bin/{TARGET}-cc", CXX=f"{prefix}/bin/{TARGET}-c++")


@pytest.mark.heavy
def test_installs_conda_forge_names_and_relocates(toolchain_prefixes):
    for prefix in toolchain_prefixes:
        for cmd in ("cc", "c++", "gcc", "g++", "cpp", "ld", "as", "ar"):
            assert (prefix / "bin" / f"{TARGET}-{cmd}").is_file(), f"{prefix}: no bin/{TARGET}-{cmd}"
        assert (prefix / TARGET / "sysroot/usr/include/stdio.h").is_file()
        assert (prefix / "share/lingbot-probe/probe.txt").read_text() == "lingbot-probe installed\n"
        probe = subprocess.run([prefix / "bin/lingbot-probe"], capture_output=True, text=True, check=True)
        assert probe.stdout.strip() == f"lingbot-probe in {prefix}"
        meta = json.loads(next((prefix / "conda-meta").glob("gcc_linux-64-*.json")).read_text())
        assert meta["name"] == "gcc_linux-64"
    # The wrappers name no install location: each copy works where it was installed.
    for wrapper in (toolchain_prefixes[0] / "bin").glob(f"{TARGET}-*"):
        assert str(toolchain_prefixes[0]) not in wrapper.read_text()


@pytest.mark.heavy
def test_activation_scripts_set_and_restore_compiler_variables(toolchain_prefixes):
    prefix = toolchain_prefixes[1]
    script = (
        'CC=/old/cc; export CC; for f in "$CONDA_PREFIX"/etc/conda/activate.d/*.sh; do . "$f"; done; '
        'echo "$CC"; echo "$CXX"; "$CXX" --version | head -n1; '
        'for f in "$CONDA_PREFIX"/etc/conda/deactivate.d/*.sh; do . "$f"; done; '
        'echo "$CC"; echo "${CXX-unset}"'
    )
    out = subprocess.run(
        ["sh", "-c", script], env={"CONDA_PREFIX": str(prefix), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert out[0] == f"{prefix}/bin/{TARGET}-cc"
    assert out[1] == f"{prefix}/bin/{TARGET}-c++"
    assert "12.2.0" in out[2]
    assert out[3:] == ["/old/cc", "unset"]


@pytest.mark.heavy
@pytest.mark.skipif(
    shutil.which("shellcheck") is None, reason="shellcheck not installed (see .ci/apt-packages.txt)"
)
def test_shipped_shell_scripts_pass_shellcheck(toolchain_prefixes):
    prefix = toolchain_prefixes[0]
    scripts = [*(prefix / "bin").glob(f"{TARGET}-*"), *(prefix / "etc/conda").glob("*.d/*.sh")]
    result = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.fast
def test_make_package_rejects_bad_input_and_leaves_nothing(tmp_path):
    with pytest.raises(ValueError, match="bad file path"):
        make_package(tmp_path, "bad", "1", {"../escape": b"x"})
    with pytest.raises(ValueError, match=f"lacks {PREFIX_PLACEHOLDER}"):
        make_package(tmp_path, "bad", "1", {"bin/x": b"#!/bin/sh\n"}, has_prefix_text=["bin/x"])
    with pytest.raises(ValueError, match="not in the package"):
        make_package(tmp_path, "bad", "1", {"bin/x": b"x"}, has_prefix_text=["bin/y"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.heavy
@pytest.mark.worker
@pytest.mark.parametrize("which", [0, 1], ids=["prefix-a", "prefix-b"])
def test_c_extension_builds_and_imports_inside_worker(worker, worker_env, toolchain_prefixes, which):
    prefix = toolchain_prefixes[which]
    env = compiler_env(worker_env, prefix)
    result = worker.run([PYTHON, "-c", TRITON_BUILD], env=env, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    answer, module_path = result.stdout.split()
    assert answer == "5.0"
    assert module_path.startswith(env["TRITON_CACHE_DIR"])


@pytest.mark.heavy
@pytest.mark.worker
def test_c_and_cxx_direct_invocation_inside_worker(worker, worker_env, toolchain_prefixes, tmp_path):
    prefix = toolchain_prefixes[1]
    env = compiler_env(worker_env, prefix)
    (tmp_path / "hello.cpp").write_text(
        "#include <iostream>\n#include <vector>\nint main() { std::vector<int> v{1, 2, 3};\n"
        '  std::cout << "sum " << v[0] + v[1] + v[2] << std::endl; return 0; }\n'
    )
    (tmp_path / "omp.c").write_text(
        "#include <omp.h>\n#include <stdio.h>\nint main(void) { int n = 0;\n"
        "#pragma omp parallel reduction(+:n) num_threads(2)\n  n += 1;\n"
        '  printf("threads %d\\n", n); return 0; }\n'
    )
    script = (
        f'"$CXX" -O1 hello.cpp -o hello && ./hello && "$CC" -fopenmp omp.c -o omp && '
        f"LD_LIBRARY_PATH={TORCH_LIB} ./omp"
    )
    result = worker.run(["sh", "-c", script], env=env, cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split("\n")[:2] == ["sum 6", "threads 2"]
