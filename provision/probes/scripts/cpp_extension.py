"""torch.utils.cpp_extension's JIT path (IsaacGym's gymtorch is built this way on first import):
load_inline a C++ function that uses torch's headers, built by ninja with $CXX into a throwaway build
dir, imported and called. Both the C++ compiler and ninja must resolve into the env under --worker."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

from envcheck_probe_common import collector_off, emit, failed, located, outside

CPP = """
#include <torch/extension.h>
// nonce %s: never in any cache
torch::Tensor envcheck_axpy(torch::Tensor x, torch::Tensor y, double a) { return x * a + y; }
"""


def main(args: dict) -> None:
    path = os.environ.get("PATH", "")
    cxx = os.environ.get("CXX") or "c++"  # what torch.utils.cpp_extension uses
    real_cxx = located(cxx, path)
    ninja = shutil.which("ninja", path=path)
    real_ninja = os.path.realpath(ninja) if ninja else None
    where = {"compiler": cxx, "compiler_path": real_cxx, "ninja": ninja, "ninja_path": real_ninja}
    prefix = args["require_under"]
    if prefix and real_cxx is not None and outside(real_cxx, prefix):
        return emit(ok=False, stage="locate", **where)
    # ninja is judged once the compiler is the env's: with no compiler at all, the real build error shows
    if prefix and real_cxx is not None and real_ninja is not None and outside(real_ninja, prefix):
        return emit(ok=False, stage="locate_ninja", **where)
    try:
        with collector_off():
            import torch
            from torch.utils import cpp_extension
    except Exception as exc:
        return failed("import", exc, **where)
    build_dir = os.path.join(os.environ.get("TMPDIR") or "/tmp", "envcheck-cpp-extension")
    os.makedirs(build_dir, exist_ok=True)
    start = time.perf_counter()
    try:
        mod = cpp_extension.load_inline(
            name="envcheck_cpp_extension_probe",
            cpp_sources=[CPP % args["nonce"]],
            functions=["envcheck_axpy"],
            build_directory=build_dir,
            verbose=False,
        )
        x, y = torch.arange(4.0), torch.ones(4)
        value = mod.envcheck_axpy(x, y, 2.0).tolist()
    except Exception as exc:
        return failed("compile", exc, **where)
    emit(
        ok=value == [1.0, 3.0, 5.0, 7.0],
        stage="done",
        value=value,
        module=mod.__file__,
        compile_s=time.perf_counter() - start,
        **where,
    )


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
