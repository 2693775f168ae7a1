"""TorchInductor's C++ path: a fused elementwise+reduction CPU kernel, two threads so Inductor emits
an OpenMP parallel region; the kernel library it built must call into the OpenMP runtime."""

from __future__ import annotations

import glob
import json
import os
import sys
import time

from envcheck_probe_common import collector_off, emit, failed, located, outside


def main(args: dict) -> None:
    try:
        with collector_off():
            import torch
            import torch._inductor.config as inductor_config
            from torch._inductor import cpp_builder
            from torch._inductor.utils import run_and_get_cpp_code
    except Exception as exc:
        return failed("import", exc)
    inductor_config.compile_threads = 1  # no compile-worker pool to start: this is a probe, not a job
    if args["fast"]:
        inductor_config.cpp.vec_isa_ok = False  # skips the at::vec headers: ~2x faster to compile
    torch.set_num_threads(2)
    cxx, real = None, None
    try:
        cxx = cpp_builder.get_cpp_compiler()
        real = located(cxx, os.environ.get("PATH", ""))
    except Exception:
        pass  # torch.compile below raises the real error the way a job sees it
    if cxx is not None and args["require_under"] and outside(real, args["require_under"]):
        return emit(ok=False, stage="locate", compiler=cxx, compiler_path=real)

    def fn(x, y):
        return (torch.sin(x) * y + x.sum(dim=-1, keepdim=True)).relu()

    x, y = torch.randn(64, 4096), torch.randn(64, 4096)
    start = time.perf_counter()
    try:
        out, code = run_and_get_cpp_code(torch.compile(fn, backend="inductor", fullgraph=True), x, y)
    except Exception as exc:
        return failed("compile", exc, compiler=cxx, compiler_path=real)
    seconds = time.perf_counter() - start
    error = (out - fn(x, y)).abs().max().item()
    omp = "#pragma omp parallel" in code
    kernels = glob.glob(os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "**", "*.so"), recursive=True)
    gomp = []
    for path in kernels:
        with open(path, "rb") as f:
            if b"GOMP_parallel" in f.read():
                gomp.append(path)
    emit(
        ok=error < 1e-3 and omp and bool(gomp),
        stage="done",
        compiler=cxx,
        compiler_path=real,
        max_abs_error=error,
        omp_pragma=omp,
        kernels=len(kernels),
        kernels_with_openmp=len(gomp),
        compile_s=seconds,
    )


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
