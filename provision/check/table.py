"""bin/envcheck's checks as one declarative table, and the runner that walks it in order.

Each row (`CheckSpec`) names a check, its function (`Context -> Outcome`), when it is part of the
run at all (`only`: --fast leaves the slow ones out), and its prerequisites: `needs_job_env` (the
env's variables must be readable, or the caller's environment stands in for bin/train's tool-env
fallback), `needs_pass` (checks that must have PASSed), `needs_not_fail` (checks that must not have
FAILed; a callable when it depends on the node), `skip_when` (a reason to SKIP, e.g. no GPU here).
A skipped check says which prerequisite failed. `stop_on_fail`: nothing after it can be checked.

The slow rows (`slow`: real compiles, each a probe in its own process) run at once, each in a thread
that first waits for its own prerequisites (Context.result waits for a running check): the whole
--worker proof takes about as long as its longest chain (Inductor's kernel, then FlexAttention), not the
sum of every compile. The other rows run in order on the calling thread; the report lists every row in
the table's order whatever the order they finished in. When run_table returns, the run's compile scratch
(Context.compile_scratch: Inductor's, then CPU FlexAttention's) is removed.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from provision.check import checks_compile as comp
from provision.check import checks_env as envc
from provision.check import checks_node as node
from provision.check.context import Context, Outcome, fail_unexpected
from provision.check.report import FAIL, PASS, SKIP, Check

Needs = tuple[str, ...] | Callable[[Context], tuple[str, ...]]


def _full(ctx: Context) -> bool:
    return not ctx.fast


@dataclass(frozen=True)
class CheckSpec:
    name: str
    run: Callable[[Context], Outcome]
    only: Callable[[Context], bool] | None = None
    needs_job_env: bool = False
    needs_pass: tuple[str, ...] = ()
    needs_not_fail: Needs = ()
    skip_when: Callable[[Context], str] | None = None
    stop_on_fail: bool = False
    slow: str = ""


TABLE: tuple[CheckSpec, ...] = (
    CheckSpec("env.prefix", envc.check_prefix, stop_on_fail=True),
    CheckSpec("env.complete", envc.check_complete),
    CheckSpec("env.lock", envc.check_lock),
    CheckSpec("variables.file", envc.check_variables_file),
    CheckSpec(
        "env.versions", envc.check_versions, only=_full, needs_job_env=True, slow="starting the env's python"
    ),
    CheckSpec("variables.CC", lambda ctx: envc.check_compiler_var(ctx, "CC"), needs_job_env=True),
    CheckSpec("variables.CXX", lambda ctx: envc.check_compiler_var(ctx, "CXX"), needs_job_env=True),
    CheckSpec(
        "toolchain.sysroot",
        envc.check_sysroot,
        needs_job_env=True,
        needs_pass=("variables.CC", "variables.CXX"),
    ),
    CheckSpec("toolchain.openssl", envc.check_openssl, needs_job_env=True),
    CheckSpec(
        "compile.triton_build", comp.check_triton_build, needs_job_env=True, slow="Triton C build (~1 s)"
    ),
    CheckSpec(
        "compile.inductor_cpp",
        comp.check_inductor,
        needs_job_env=True,
        slow="TorchInductor CPU kernel with CXX + OpenMP (10-30 s cold)",
    ),
    CheckSpec(
        "compile.flex_attention",
        comp.check_flex,
        only=_full,
        needs_job_env=True,
        needs_not_fail=comp.flex_needs,
        slow="FlexAttention vs SDPA under torch.compile (20-60 s cold)",
    ),
    CheckSpec(
        "compile.cpp_extension",
        comp.check_cpp_extension,
        only=_full,
        needs_job_env=True,
        slow="torch.utils.cpp_extension.load_inline with ninja + CXX (30-90 s cold)",
    ),
    CheckSpec("cache.triton_dir", node.check_triton_cache),
    CheckSpec("fs.triton_cache", node.check_triton_cache_fs),
    CheckSpec("fs.inductor_cache", node.check_inductor_cache_fs),
    CheckSpec("gpu.cuda", node.check_cuda, only=_full, skip_when=node.gpu_absent_reason),
    CheckSpec("gpu.driver", node.check_driver, only=_full, skip_when=node.gpu_absent_reason),
    CheckSpec("gpu.nccl", node.check_nccl, only=_full, skip_when=node.gpu_absent_reason),
    CheckSpec("gpu.kind", node.check_gpu_kind, only=_full, skip_when=node.gpu_absent_reason),
    CheckSpec("node.glibc", node.check_glibc),
    CheckSpec("node.disk", node.check_disk),
)


def select(table: tuple[CheckSpec, ...], only: list[str], ctx: Context) -> tuple[CheckSpec, ...]:
    """`--only`: the rows named (exact names or shell patterns, e.g. `compile.*`) and every row they need,
    in the table's order: env.prefix (nothing runs without it), variables.file where a row reads the env's
    variables, and each prerequisite (needs_pass, needs_not_fail) with its own. ValueError naming a name
    that matches no row. Rows left out are not in the report, as --fast's are not."""
    by_name = {spec.name: spec for spec in table}
    wanted: set[str] = set()
    for pattern in only:
        matched = fnmatch.filter(by_name, pattern)
        if not matched:
            raise ValueError(f"{pattern!r} names no check (the checks: {', '.join(by_name)})")
        wanted.update(matched)
    basis = {spec.name for spec in table if spec.stop_on_fail}  # env.prefix: nothing runs without it
    todo = list(wanted)
    while todo:
        spec = by_name[todo.pop()]
        needs = spec.needs_not_fail(ctx) if callable(spec.needs_not_fail) else spec.needs_not_fail
        more = {*spec.needs_pass, *needs, *basis}
        if spec.needs_job_env:
            more.add("variables.file")
        for name in more - wanted:
            if name in by_name:
                wanted.add(name)
                todo.append(name)
    return tuple(spec for spec in table if spec.name in wanted)


def skip_reason(spec: CheckSpec, ctx: Context) -> str:
    """Why `spec` is not run here ("" when it is), naming the prerequisite that failed."""
    if spec.needs_job_env and ctx.job.env is None:
        return "not run: it needs the env's variables, which cannot be read (see variables.file)"
    for name in spec.needs_pass:
        done = ctx.result(name)
        if done is None or done.status != PASS:
            return f"not run: it needs {name} to PASS ({done.status if done else 'not run'})"
    needs = spec.needs_not_fail(ctx) if callable(spec.needs_not_fail) else spec.needs_not_fail
    for name in needs:
        done = ctx.result(name)
        if done is None or done.status == SKIP:
            return f"not run: it needs {name}, which was not run"
        if done.status == FAIL:
            return f"not run: it needs the compiler {name} found broken"
    return spec.skip_when(ctx) if spec.skip_when is not None else ""


def run_one(spec: CheckSpec, ctx: Context) -> Check:
    reason = skip_reason(spec, ctx)
    if reason:
        return Check(spec.name, SKIP, 0.0, reason)
    if spec.slow and ctx.progress:
        ctx.progress(f"{spec.name}: {spec.slow} ...")
    start = time.perf_counter()
    try:
        out = spec.run(ctx)
    except Exception as exc:  # a bug or an unexpected node state must not hide the other checks
        out = fail_unexpected(exc)
    check = Check(
        spec.name, out.status, round(time.perf_counter() - start, 3), out.message, out.fix, out.details
    )
    if spec.slow and ctx.progress:
        ctx.progress(f"{spec.name}: {check.status} in {check.seconds:.1f} s")
    return check


def run_table(ctx: Context, table: tuple[CheckSpec, ...] = TABLE) -> list[Check]:
    """Every applicable row; results land in ctx.results (in table order) for later rows' prerequisites.
    Slow rows start at once in threads (see the module docstring); a row that reads one waits for it."""
    rows = [spec for spec in table if spec.only is None or spec.only(ctx)]
    slow = [spec for spec in rows if spec.slow]
    done: dict[str, Check] = {}
    try:
        with ThreadPoolExecutor(max_workers=max(1, len(slow)), thread_name_prefix="envcheck") as pool:
            for spec in rows:
                if spec.slow:  # every one gets a thread of its own: one waiting for another never starves it
                    ctx.running[spec.name] = pool.submit(run_one, spec, ctx)
                    continue
                check = done[spec.name] = run_one(spec, ctx)
                ctx.results[spec.name] = check
                if spec.stop_on_fail and check.status == FAIL:
                    break
            for name, future in list(ctx.running.items()):
                done[name] = future.result()
    finally:
        ctx.release_compile_scratch()  # the pool has joined: no probe uses it any more
    ctx.running.clear()
    ctx.results.clear()
    ctx.results.update((spec.name, done[spec.name]) for spec in rows if spec.name in done)
    return list(ctx.results.values())
