"""Triton's own build path: triton.runtime.build._find_compiler picks CC (else gcc/clang on PATH) and
compile_module_from_src compiles a C extension with the Python headers and imports it."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

from envcheck_probe_common import emit, failed, located, outside

SOURCE = """
#include <Python.h>
/* nonce %s: never in any cache */
static PyObject *add(PyObject *self, PyObject *args) {
    long a, b;
    if (!PyArg_ParseTuple(args, "ll", &a, &b)) return NULL;
    return PyLong_FromLong(a + b);
}
static PyMethodDef methods[] = {{"add", add, METH_VARARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "envcheck_triton_probe", NULL, -1, methods};
PyMODINIT_FUNC PyInit_envcheck_triton_probe(void) { return PyModule_Create(&module); }
"""


def _build_old(build, src: str):
    """Older tritons: the same _build their drivers call, then an import of the result."""
    import importlib.util
    import tempfile

    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "envcheck_triton_probe.c")
    with open(path, "w") as f:
        f.write(src)
    so = build._build("envcheck_triton_probe", path, tmp, [], [], [])
    spec = importlib.util.spec_from_file_location("envcheck_triton_probe", so)
    assert spec is not None and spec.loader is not None, so
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(args: dict) -> None:
    try:
        from triton.runtime import build
    except Exception as exc:
        return failed("import", exc)
    try:
        if hasattr(build, "_find_compiler"):  # triton >= 3.5
            cc = build._find_compiler("c")
        else:  # older tritons pick the compiler inside _build, raising the same error there
            cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
            if cc is None:
                raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")
    except Exception as exc:  # the real "Failed to find C compiler" when CC is unset and PATH has none
        return failed("find", exc)
    real = located(cc, os.environ.get("PATH", ""))
    if args["require_under"] and outside(real, args["require_under"]):
        return emit(ok=False, stage="locate", compiler=cc, compiler_path=real)
    src = SOURCE % args["nonce"]
    start = time.perf_counter()
    try:
        if hasattr(build, "compile_module_from_src"):
            mod = build.compile_module_from_src(src, "envcheck_triton_probe")
        else:
            mod = _build_old(build, src)
        value = mod.add(2, 40)
    except Exception as exc:
        return failed("compile", exc, compiler=cc, compiler_path=real)
    emit(
        ok=value == 42,
        stage="done",
        compiler=cc,
        compiler_path=real,
        value=value,
        module=mod.__file__,
        compile_s=time.perf_counter() - start,
    )


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
