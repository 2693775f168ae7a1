"""Real compiles, each a probe program in a fresh process with throwaway caches (provision/probes/):
Triton's C build, TorchInductor's C++ kernel with OpenMP, FlexAttention against SDPA, and
torch.utils.cpp_extension's JIT (load_inline with torch headers, ninja, the env's CXX).

Every probe's caches are its own, except that TorchInductor's probe and then, on CPU, FlexAttention's share
the run's compile scratch (Context.compile_scratch: empty when the run starts): on CPU FlexAttention waits
for compile.inductor_cpp not to FAIL (table.py), so the two never use it at once, and FlexAttention reuses
the ISA probe and precompiled header Inductor just built with the same compiler; its own kernel still
compiles. On a GPU FlexAttention compiles through Triton, with caches of its own."""

from __future__ import annotations

from provision import nodeinfo, probes
from provision.check.context import Context, Outcome, inside, short_error
from provision.check.report import FAIL, PASS, SKIP, WARN


def _var_fix(ctx: Context, var: str) -> str:
    check = ctx.result(f"variables.{var}")
    return check.fix if check is not None and check.status == FAIL else ""


def compile_verdict(ctx: Context, run: probes.ProbeRun, var: str, what: str, passed: str) -> Outcome:
    result = run.result
    details = {k: v for k, v in result.items() if k != "ok"}
    details["python"] = ctx.probe_python()[1]
    compiler, real = result.get("compiler"), result.get("compiler_path")
    var_fix = _var_fix(ctx, var)
    if result.get("stage") == "locate":
        where = (
            "which does not exist"
            if real is None
            else "which is not in the env: it passes here only thanks to the system compiler, and a worker "
            "has none"
        )
        return Outcome(
            FAIL,
            f"{what} would use {compiler}{f' ({real})' if real else ''}, {where}",
            var_fix or ctx.package_fix(ctx.compiler_package(var)),
            details,
        )
    if not run.ok:
        details["error"] = run.failure_text()
        if "No such file or directory: 'openssl'" in details["error"]:  # Inductor's precompiled header
            return Outcome(
                FAIL,
                f"{what} failed in the job's environment: no `openssl` command (Inductor's precompiled "
                f"header runs `openssl sha512`):\n{short_error(run.failure_text())}",
                ctx.package_fix("openssl"),
                details,
            )
        sysroot = ctx.result("toolchain.sysroot")  # no glibc dev files: that row's fix is the one
        sysroot_fix = sysroot.fix if sysroot is not None and sysroot.status == FAIL else ""
        fix = (
            var_fix
            or sysroot_fix
            or (
                f"{var}={compiler} cannot do this (error above): {ctx.provision_fix()}"
                if compiler
                else ctx.provision_fix()
            )
        )
        return Outcome(
            FAIL, f"{what} failed in the job's environment:\n{short_error(run.failure_text())}", fix, details
        )
    if compiler and not inside(real, ctx.prefix):
        return Outcome(
            WARN,
            f"{passed}, but with {real}, a system compiler: a worker has none (run with --worker)",
            var_fix or ctx.package_fix(ctx.compiler_package(var)),
            details,
        )
    return Outcome(PASS, passed, "", details)


def check_triton_build(ctx: Context) -> Outcome:
    run = ctx.probe(
        "triton_build", {"nonce": probes.nonce(), "require_under": ctx.require_under()}, timeout=180
    )
    r = run.result
    passed = (
        f"triton.runtime.build compiled and imported a C extension with {r.get('compiler')} in "
        f"{r.get('compile_s', 0):.1f} s"
    )
    return compile_verdict(ctx, run, "CC", "Triton's C build (triton.runtime.build)", passed)


def check_inductor(ctx: Context) -> Outcome:
    args = {"fast": ctx.fast, "require_under": ctx.require_under()}
    run = ctx.probe("inductor_cpp", args, timeout=900, shared=ctx.compile_scratch())
    r = run.result
    passed = (
        f"Inductor compiled a CPU kernel with {r.get('compiler')} in {r.get('compile_s', 0):.1f} s, OpenMP "
        f"parallel region in {r.get('kernels_with_openmp')} kernel(s), max error "
        f"{r.get('max_abs_error', float('nan')):.1e}{' (scalar code: --fast)' if ctx.fast else ''}"
    )
    if run.returncode == 0 and r.get("stage") == "done" and not r.get("ok"):
        r["error"] = (
            f"the compiled kernel is wrong or not parallel: max error {r.get('max_abs_error')}, omp pragma "
            f"{r.get('omp_pragma')}, kernels calling OpenMP {r.get('kernels_with_openmp')}"
        )
    return compile_verdict(ctx, run, "CXX", "TorchInductor's C++ build", passed)


def flex_on_gpu(ctx: Context) -> bool:
    return bool(ctx.interpreter and ctx.interpreter.get("cuda_available"))


def flex_needs(ctx: Context) -> tuple[str, ...]:
    """On CPU FlexAttention compiles through Inductor's C++ path, on a GPU through Triton."""
    return ("compile.triton_build",) if flex_on_gpu(ctx) else ("compile.inductor_cpp",)


PLATFORM_MACHINE = {"linux-64": "x86_64", "linux-aarch64": "aarch64"}  # conda's platform -> uname -m


def flex_cpu_unsupported(ctx: Context) -> str:
    """Why FlexAttention cannot compile on this node's CPU ("" if it can): torch's CPU lowering needs AVX2
    (torch/_inductor/kernel/flex/flex_cpu.py check_cpu_supported), i.e. an x86 CPU. The machine is the env's
    python's (the interpreter probe); when that told nothing, the env's platform (its python runs only on
    that machine) on a node without a GPU."""
    if flex_on_gpu(ctx):
        return ""
    info = ctx.interpreter
    if info is not None:
        machine, known = info.get("machine"), "the env's python runs"
    elif nodeinfo.cpu_only_node():
        machine, known = PLATFORM_MACHINE.get(ctx.platform), f"the env is for {ctx.platform}"
    else:
        return ""  # a GPU node whose python told nothing: the probe runs and says what it finds
    if machine in (None, "x86_64", "AMD64"):
        return ""
    return (
        f"FlexAttention has no CPU compile path on {machine} ({known} there): torch's CPU lowering needs "
        f"AVX2 (x86 only; torch._inductor.kernel.flex.flex_cpu.check_cpu_supported); on a GPU node it "
        f"compiles through Triton (compile.triton_build)"
    )


def check_flex(ctx: Context) -> Outcome:
    reason = flex_cpu_unsupported(ctx)
    if reason:
        return Outcome(SKIP, reason)
    gpu = flex_on_gpu(ctx)
    args = {"gpu": gpu, "require_under": ctx.require_under() if not gpu else None}
    run = ctx.probe("flex_attention", args, timeout=1200, shared=None if gpu else ctx.compile_scratch())
    r = run.result
    if run.returncode == 0 and r.get("stage") == "done" and not r.get("ok"):
        r["error"] = (
            f"FlexAttention disagrees with SDPA: forward max error {r.get('forward_max_abs_error')}, "
            f"backward "
            f"{r.get('backward_max_abs_error', 'n/a')}"
        )
    backward = (
        f", backward {r['backward_max_abs_error']:.1e}"
        if "backward_max_abs_error" in r
        else " (forward only: FlexAttention has no CPU backward)"
    )
    passed = (
        f"compiled FlexAttention ({r.get('device')}, {r.get('tokens')} tokens, LingBot block mask "
        f"{100 * r.get('masked_share', 0):.0f}% masked) in {r.get('compile_s', 0):.1f} s; vs SDPA: "
        f"forward max "
        f"error {r.get('forward_max_abs_error', float('nan')):.1e}{backward}"
    )
    return compile_verdict(ctx, run, "CC" if gpu else "CXX", "FlexAttention under torch.compile", passed)


def check_cpp_extension(ctx: Context) -> Outcome:
    run = ctx.probe(
        "cpp_extension", {"nonce": probes.nonce(), "require_under": ctx.require_under()}, timeout=900
    )
    r = run.result
    if r.get("stage") == "locate_ninja":
        return Outcome(
            FAIL,
            f"torch.utils.cpp_extension would build with {r.get('ninja')} ({r.get('ninja_path')}), "
            f"which is not "
            f"in the env: it passes here only thanks to the system's ninja, and a worker has none",
            f"lock ninja in the env (environment.yml pip: ninja), relock "
            f"(bin/provision {ctx.spec_name} --relock), "
            f"provision (bin/provision {ctx.spec_name})",
            {k: v for k, v in r.items() if k != "ok"},
        )
    if not run.ok and "Ninja is required" in run.failure_text():
        return Outcome(
            FAIL,
            f"torch.utils.cpp_extension failed in the job's environment:\n{short_error(run.failure_text())}",
            f"the env lacks ninja: add it to environment.yml (pip: ninja), relock (bin/provision "
            f"{ctx.spec_name} --relock), provision (bin/provision {ctx.spec_name})",
            {k: v for k, v in r.items() if k != "ok"},
        )
    passed = (
        f"torch.utils.cpp_extension.load_inline built and called a torch C++ function with "
        f"{r.get('compiler')} and {r.get('ninja')} in {r.get('compile_s', 0):.1f} s"
    )
    return compile_verdict(ctx, run, "CXX", "torch.utils.cpp_extension (load_inline)", passed)
