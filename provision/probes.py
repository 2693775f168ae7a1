"""Real compiles and interpreter facts, each in a fresh subprocess with throwaway caches.

A probe is a small self-contained Python script run by the env's python (or the tool python when the
env has none) in the job's environment. It prints one line ``ENVCHECK_RESULT=<json>`` on stdout. The
caches it could read are all private and empty: TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and TMPDIR
(Inductor keeps precompiled headers under ``$TMPDIR/torchinductor_$USER`` whatever
TORCHINDUCTOR_CACHE_DIR says), so a warm cache can never stand in for a missing compiler.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

RESULT_MARKER = "ENVCHECK_RESULT="

# Shared by the scripts below: report a result or the real exception, verbatim.
_PRELUDE = r"""
import json, os, shutil, sys, time, traceback

def emit(**result):
    print("ENVCHECK_RESULT=" + json.dumps(result), flush=True)

def chain(exc):
    seen = []
    while exc is not None and all(exc is not e for e in seen):
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen

def error_text(exc):
    # The exception as a user sees it, one line per link of its cause chain (Dynamo wraps Inductor's
    # errors); error_detail() has the full text.
    lines = []
    for link in chain(exc):
        first = (str(link).strip().splitlines() or [""])[0]
        line = f"{type(link).__name__}: {first}".rstrip(": ")
        if line not in lines:
            lines.append(line)
    return "\n".join(lines)

def error_detail(exc):
    return "\n".join(f"{type(link).__name__}: {link}" for link in chain(exc))[:20000]

def located(command, path):
    # A compiler command as the job resolves it: absolute path, symlinks followed.
    found = command if os.sep in command else shutil.which(command, path=path)
    return os.path.realpath(found) if found and os.path.exists(found) else None

def outside(real, prefix):
    return prefix and (real is None or not real.startswith(os.path.realpath(prefix) + os.sep))
"""

# Triton's own build path: triton.runtime.build._find_compiler picks CC (else gcc/clang on PATH) and
# compile_module_from_src compiles with the Python headers and imports the result.
TRITON_BUILD = (
    _PRELUDE
    + r"""
args = json.loads(sys.argv[1])
try:
    from triton.runtime import build
except Exception as exc:
    emit(ok=False, stage="import", error=error_text(exc), error_detail=error_detail(exc)); sys.exit(0)
try:
    if hasattr(build, "_find_compiler"):  # triton >= 3.5
        cc = build._find_compiler("c")
    else:  # older tritons pick the compiler inside _build, raising the same error there
        cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
        if cc is None:
            raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")
except Exception as exc:  # the real "Failed to find C compiler" when CC is unset and PATH has none
    emit(ok=False, stage="find", error=error_text(exc), error_detail=error_detail(exc)); sys.exit(0)
real = located(cc, os.environ.get("PATH", ""))
if args["require_under"] and outside(real, args["require_under"]):
    emit(ok=False, stage="locate", compiler=cc, compiler_path=real); sys.exit(0)
src = '''
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
''' % args["nonce"]
start = time.perf_counter()
try:
    if hasattr(build, "compile_module_from_src"):
        mod = build.compile_module_from_src(src, "envcheck_triton_probe")
    else:  # older tritons: the same _build their drivers call, then an import of the result
        import importlib.util, tempfile
        tmp = tempfile.mkdtemp()
        with open(os.path.join(tmp, "envcheck_triton_probe.c"), "w") as f:
            f.write(src)
        so = build._build("envcheck_triton_probe", f.name, tmp, [], [], [])
        spec = importlib.util.spec_from_file_location("envcheck_triton_probe", so)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    value = mod.add(2, 40)
except Exception as exc:
    emit(ok=False, stage="compile", compiler=cc, compiler_path=real, error=error_text(exc), error_detail=error_detail(exc)); sys.exit(0)
emit(ok=value == 42, stage="done", compiler=cc, compiler_path=real, value=value,
     module=mod.__file__, compile_s=time.perf_counter() - start)
"""
)

# TorchInductor's C++ path: a fused elementwise+reduction CPU kernel, two threads so Inductor emits
# an OpenMP parallel region, then the loaded libgomp is looked up in the process's maps.
INDUCTOR_CPP = (
    _PRELUDE
    + r"""
args = json.loads(sys.argv[1])
try:
    import torch
    import torch._inductor.config as inductor_config
    from torch._inductor import cpp_builder
    from torch._inductor.utils import run_and_get_cpp_code
except Exception as exc:
    emit(ok=False, stage="import", error=error_text(exc), error_detail=error_detail(exc)); sys.exit(0)
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
    emit(ok=False, stage="locate", compiler=cxx, compiler_path=real); sys.exit(0)

def fn(x, y):
    return (torch.sin(x) * y + x.sum(dim=-1, keepdim=True)).relu()

x, y = torch.randn(64, 4096), torch.randn(64, 4096)
start = time.perf_counter()
try:
    out, code = run_and_get_cpp_code(torch.compile(fn, backend="inductor", fullgraph=True), x, y)
except Exception as exc:
    emit(ok=False, stage="compile", compiler=cxx, compiler_path=real, error=error_text(exc), error_detail=error_detail(exc)); sys.exit(0)
seconds = time.perf_counter() - start
error = (out - fn(x, y)).abs().max().item()
omp = "#pragma omp parallel" in code
# The kernel library Inductor built (in the private cache) must call into the OpenMP runtime.
import glob
kernels = glob.glob(os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "**", "*.so"), recursive=True)
gomp = [path for path in kernels if b"GOMP_parallel" in open(path, "rb").read()]
emit(ok=error < 1e-3 and omp and bool(gomp), stage="done", compiler=cxx, compiler_path=real,
     max_abs_error=error, omp_pragma=omp, kernels=len(kernels), kernels_with_openmp=len(gomp),
     compile_s=seconds)
"""
)

# FlexAttention with a LingBot-VA-style block mask against SDPA with the same mask, dense.
FLEX_ATTENTION = (
    _PRELUDE
    + r"""
args = json.loads(sys.argv[1])
try:
    import torch
    import torch._inductor.config as inductor_config
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention
except Exception as exc:
    emit(ok=False, stage="import", error=error_text(exc), error_detail=error_detail(exc)); sys.exit(0)
inductor_config.compile_threads = 1
torch.set_num_threads(2)
gpu = args["gpu"] and torch.cuda.is_available()
device = "cuda" if gpu else "cpu"
# Tokens: [noisy chunks | clean chunks], chunk k of each holds `per_block` tokens.
blocks, per_block, window = 4, 64, 2
half = blocks * per_block
pos = torch.arange(2 * half, device=device)
block_id = (pos % half) // per_block
noisy = pos < half

def lingbot_mask(b, h, q, kv):
    qb, kb, qn, kn = block_id[q], block_id[kv], noisy[q], noisy[kv]
    clean_clean = ~qn & ~kn & (kb <= qb)   # block-causal
    noisy_clean = qn & ~kn & (kb < qb)     # strictly earlier chunks
    noisy_noisy = qn & kn & (kb == qb)     # own chunk only
    return (clean_clean | noisy_clean | noisy_noisy) & (qb - kb <= window)

compiler, real = None, None
try:  # the compiler this compile will use: Inductor's C++ on CPU, Triton's C (driver build) on a GPU
    if gpu:
        from triton.runtime import build
        compiler = build._find_compiler("c")
    else:
        from torch._inductor import cpp_builder
        compiler = cpp_builder.get_cpp_compiler()
    real = located(compiler, os.environ.get("PATH", ""))
except Exception:
    pass  # torch.compile below raises the real error the way a job sees it
if compiler is not None and args["require_under"] and outside(real, args["require_under"]):
    emit(ok=False, stage="locate", compiler=compiler, compiler_path=real); sys.exit(0)
L = 2 * half
block_mask = create_block_mask(lingbot_mask, None, None, L, L, device=device)
dense = create_mask(lingbot_mask, None, None, L, L, device=device)
dtype = torch.bfloat16 if gpu else torch.float32
gen = torch.Generator(device=device).manual_seed(0)
q, k, v = (torch.randn(2, 4, L, 64, device=device, dtype=dtype, generator=gen, requires_grad=gpu)
           for _ in range(3))
start = time.perf_counter()
try:
    compiled = torch.compile(flex_attention, fullgraph=True)
    out = compiled(q, k, v, block_mask=block_mask)
    if gpu:
        out.float().square().sum().backward()
except Exception as exc:
    emit(ok=False, stage="compile", device=device, compiler=compiler, compiler_path=real,
         error=error_text(exc), error_detail=error_detail(exc)); sys.exit(0)
seconds = time.perf_counter() - start
q32, k32, v32 = (t.detach().float().requires_grad_(gpu) for t in (q, k, v))
ref = F.scaled_dot_product_attention(q32, k32, v32, attn_mask=dense)
result = {"device": device, "tokens": L, "compiler": compiler, "compiler_path": real, "masked_share": 1 - dense.float().mean().item(),
          "forward_max_abs_error": (out.float() - ref).abs().max().item(), "compile_s": seconds}
tolerance = 2e-2 if gpu else 1e-4
ok = result["forward_max_abs_error"] < tolerance
if gpu:
    ref.square().sum().backward()
    result["backward_max_abs_error"] = max(
        (a.grad.float() - b.grad).abs().max().item() / max(b.grad.abs().max().item(), 1e-6)
        for a, b in ((q, q32), (k, k32), (v, v32)))
    ok = ok and result["backward_max_abs_error"] < 5e-2
emit(ok=ok, stage="done", **result)
"""
)

# What the interpreter is: versions, and the CUDA/NCCL facts a GPU job depends on.
INTERPRETER = (
    _PRELUDE
    + r"""
import ctypes, platform
result = {"python": platform.python_version(), "executable": sys.executable}
for name in ("torch", "triton"):
    try:
        module = __import__(name)
        result[name] = module.__version__
    except Exception as exc:
        result[name] = None
        result[name + "_error"] = error_text(exc)
if result["torch"]:
    import torch
    result["torch_cuda"] = torch.version.cuda
    try:
        result["cuda_available"] = torch.cuda.is_available()
        result["cuda_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception as exc:
        result["cuda_available"], result["cuda_error"] = False, error_text(exc)
    if torch.version.cuda:
        try:
            result["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as exc:
            result["nccl"], result["nccl_error"] = None, error_text(exc)
emit(ok=True, **result)
"""
)


@dataclass
class ProbeRun:
    """One probe's outcome: `result` is its JSON (empty if it printed none), `seconds` its wall time."""

    name: str
    returncode: int | None
    result: dict
    seconds: float
    stdout: str
    stderr: str
    timed_out: bool = False
    caches: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.result.get("ok")) and self.returncode == 0

    def failure_text(self) -> str:
        """The error as reported by the probe, else the tail of what the process printed."""
        if self.timed_out:
            return f"timed out after {self.seconds:.0f} s"
        if self.result.get("error"):
            return str(self.result["error"])
        tail = "\n".join((self.stderr or self.stdout).strip().splitlines()[-6:])
        return tail or f"exit status {self.returncode} and no output"


def throwaway_caches(scratch: Path) -> dict[str, str]:
    """Fresh, empty cache locations under `scratch`, including a private TMPDIR."""
    caches = {
        "TRITON_CACHE_DIR": scratch / "triton",
        "TORCHINDUCTOR_CACHE_DIR": scratch / "inductor",
        "TMPDIR": scratch / "tmp",
    }
    for path in caches.values():
        path.mkdir(parents=True)
    return {name: str(path) for name, path in caches.items()}


def run_probe(
    name: str,
    script: str,
    python: str,
    env: Mapping[str, str],
    *,
    args: dict | None = None,
    timeout: float = 300,
    progress: Callable[[str], None] | None = None,
    heartbeat_s: float = 10.0,
) -> ProbeRun:
    """Run `script` with `python` in `env` plus throwaway caches; the scratch dir is removed after.

    `progress` gets a line every `heartbeat_s` while the probe runs (the slow compiles)."""
    scratch = Path(tempfile.mkdtemp(prefix=f"envcheck-{name}-"))
    try:
        caches = throwaway_caches(scratch)
        script_path = scratch / f"envcheck_probe_{name}.py"  # never shadows a module
        script_path.write_text(script)
        argv: Sequence[str] = [python, str(script_path), json.dumps(args or {})]
        start = time.perf_counter()
        try:
            proc = subprocess.Popen(
                argv,
                env={**env, **caches},
                cwd=scratch,  # never import the caller's working tree by accident
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,  # its own process group: a timeout kills Inductor's workers too
            )
        except OSError as exc:
            return ProbeRun(name, None, {"ok": False, "error": f"cannot run {python}: {exc}"}, 0.0, "", "")
        try:
            stdout, stderr, timed_out = _communicate(proc, timeout, progress, heartbeat_s, name, start)
        finally:
            _kill_group(proc)  # nothing of the probe outlives it (a timeout, a signal, an exception)
        seconds = time.perf_counter() - start
        return ProbeRun(
            name,
            proc.returncode,
            _parse_result(stdout),
            seconds,
            stdout,
            stderr,
            timed_out=timed_out,
            caches=caches,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _communicate(proc, timeout, progress, heartbeat_s, name, start) -> tuple[str, str, bool]:
    deadline = start + timeout
    while True:
        wait = min(heartbeat_s, max(deadline - time.perf_counter(), 0.01))
        try:
            stdout, stderr = proc.communicate(timeout=wait)
            return stdout, stderr, False
        except subprocess.TimeoutExpired:
            if time.perf_counter() >= deadline:
                _kill_group(proc)
                stdout, stderr = proc.communicate()
                return stdout, stderr, True
            if progress is not None:
                progress(f"{name}: still compiling ({time.perf_counter() - start:.0f} s)")


def _parse_result(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            try:
                result = json.loads(line[len(RESULT_MARKER) :])
            except json.JSONDecodeError:
                return {}
            return result if isinstance(result, dict) else {}
    return {}


def nonce() -> str:
    return f"{os.getpid()}-{time.time_ns()}"
