"""bin/envcheck's command line.

--json follows the one convention of bin/provision, bin/envcheck and bin/train: stdout carries exactly
one JSON object (the report), the text report and progress go to stderr, the exit status is unchanged
(0 only if nothing FAILed). --json-file FILE writes the same JSON report to FILE atomically and keeps
the text report on stdout. `--json -` (what trainer/sbatch.py writes) means --json; the old
`--json FILE` still works, with a notice, as --json-file FILE.
"""

from __future__ import annotations

import fnmatch
import os
import signal
import subprocess
import sys
from pathlib import Path

import click

from provision.check import TABLE, run_checks
from provision.jsonout import JsonRequest, outcome, run_click
from provision.prefix import resolve_prefix


def only_patterns(given: tuple[str, ...]) -> list[str]:
    """--only's values (repeatable, comma-separated), each matching at least one check's name."""
    names = [spec.name for spec in TABLE]
    patterns = [p.strip() for value in given for p in value.split(",") if p.strip()]
    if given and not patterns:  # `--only ''` must not widen to the whole proof
        raise click.UsageError("--only needs a check's name (e.g. --only compile.cpp_extension)")
    for pattern in patterns:
        if not fnmatch.filter(names, pattern):
            raise click.UsageError(
                f"--only {pattern}: no check has that name (the checks: {', '.join(names)})"
            )
    return patterns


class Stopped(Exception):
    """SIGTERM or SIGINT arrived while the checks ran (a Slurm time limit, scancel, Ctrl-C)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop_on_signals() -> None:
    """SIGTERM/SIGINT: every running probe's process group is ended at once (provision.probes.stop_all) and
    Stopped is raised in the main thread, so the run's scratch dirs are removed and it exits 128 + signal,
    not after the slowest compile and not leaving /tmp/envcheck-* behind. A second signal only stops."""

    def stop(signum: int, _frame: object) -> None:
        from provision.probes import stop_all

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop_all())
        stop_all()
        raise Stopped(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)


def _lock_dirs(prefix: Path, lockfile: Path | None) -> list[Path]:
    """The dirs of the lock and spec the env was provisioned from (or --lockfile's): visible inside."""
    from provision.prefix import read_manifest

    try:
        manifest = read_manifest(prefix)
    except (OSError, ValueError):
        manifest = {}
    paths: list[str | Path | None] = (
        [lockfile] if lockfile else [manifest.get("lockfile"), manifest.get("spec")]
    )
    dirs = {Path(os.path.realpath(Path(p).parent)) for p in paths if p}
    return sorted(d for d in dirs if d.is_dir())


def _simulate_aarch64(params: dict, argv: list[str]) -> int:
    """--simulate-worker --platform linux-aarch64 on an x86 host: the env's own (aarch64) python runs
    envcheck --worker chrooted in an emulated compiler-less arm64 root (provision/emulation.py)."""
    from provision import emulation

    given = Path(resolve_prefix(name=params["env_name"], prefix=params["prefix"])).absolute()
    prefix = Path(os.path.realpath(given))
    python = prefix / "bin" / "python"
    try:
        machine = Path(os.path.realpath(python)).read_bytes()[18:20].hex()
    except OSError:
        machine = ""
    if machine != "b700":
        click.echo(
            f"envcheck: --simulate-worker --platform linux-aarch64: {python} is not an aarch64 program "
            f"({'missing' if not machine else 'ELF machine ' + machine}); provision the aarch64 env first: "
            f"bin/provision lingbot-b200 --platform linux-aarch64 --prefix {prefix}",
            err=True,
        )
        return 2
    cache = Path(os.environ.get("LINGBOT_FIXTURES_CACHE") or Path.home() / ".cache" / "lingbot-fixtures")
    try:
        qemu, root = emulation.qemu_root(cache / "emulation"), emulation.arm64_root(cache / "emulation")
        click.echo(
            f"envcheck: re-running in an emulated aarch64 worker ({root}): {' '.join(argv[1:])}", err=True
        )
        with emulation.binfmt(qemu):
            checkout = Path(os.path.realpath(Path(__file__).parents[2]))
            binds = [prefix, checkout, *_lock_dirs(prefix, params["lockfile"])]
            if given != prefix:  # the env's symlink to its generation, as bin/provision makes it
                binds.append(Path(os.path.realpath(given.parent)))
            if params["json_file"]:  # the report is written inside: its directory, at the same path
                out_dir = Path(os.path.realpath(Path(params["json_file"]).absolute().parent))
                out_dir.mkdir(parents=True, exist_ok=True)
                binds.append(out_dir)
            # `-m provision.check` from the checkout, as bin/envcheck runs it; qemu as a Grace core
            inner = ["/usr/bin/env", "-C", str(checkout), "-", "PATH=/usr/bin:/bin", f"HOME={Path.home()}",
                     f"QEMU_CPU={emulation.GRACE_QEMU_CPU}", str(python), *argv[1:]]  # fmt: skip
            return subprocess.run(
                emulation.chroot_command(root, inner, binds), stdin=subprocess.DEVNULL
            ).returncode
    except emulation.EmulationError as exc:
        click.echo(f"envcheck: --simulate-worker --platform linux-aarch64: {exc}", err=True)
        return 2


def _simulate(params: dict) -> int:
    from provision import worker_sim

    argv = [sys.executable, "-m", "provision.check", "--worker"]
    for flag, key in (("--fast", "fast"), ("--json", "as_json")):
        if params[key]:
            argv.append(flag)
    for pattern in params["only"]:
        argv += ["--only", pattern]
    for option, key in (
        ("--env", "env_name"),
        ("--prefix", "prefix"),
        ("--json-file", "json_file"),
        ("--lockfile", "lockfile"),
        ("--mountinfo", "mountinfo"),
    ):
        if params[key] is not None:
            value = params[key]  # paths absolute: the emulated worker runs from the checkout
            argv += [option, str(value.absolute() if isinstance(value, Path) else value)]
    from provision.lock import current_platform

    if params["platform"] and params["platform"] != current_platform():
        if params["platform"] != "linux-aarch64":
            click.echo(f"envcheck: --platform {params['platform']}: only linux-aarch64 is emulated", err=True)
            return 2
        return _simulate_aarch64(params, argv)
    ok, reason = worker_sim.available()
    if not ok:
        click.echo(
            f"envcheck: --simulate-worker: {reason}. Run `bin/envcheck --worker` on a worker instead "
            f"(e.g. srun -N1 bin/envcheck --worker).",
            err=True,
        )
        return 2
    sim = worker_sim.WorkerSimulation()
    click.echo(
        f"envcheck: re-running inside the worker simulation ({sim.hidden_count} toolchain paths "
        f"hidden): {' '.join(argv[1:])}",
        err=True,
    )
    return subprocess.run(sim.command(argv), env=os.environ, stdin=subprocess.DEVNULL).returncode


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--env",
    "env_name",
    metavar="NAME",
    help="Env name under the envs dir [default: the active env, else lingbot-b200].",
)
@click.option("--prefix", type=click.Path(path_type=Path), help="Env prefix (instead of --env).")
@click.option(
    "--worker", is_flag=True, help="Check as a non-activated job on a compiler-less worker sees it."
)
@click.option(
    "--json",
    "as_json",
    is_flag=False,
    flag_value="-",
    default=None,
    metavar="[-]",
    help="Exactly one JSON object (the report) on stdout; the text report on stderr. "
    "(`--json -` is the same; `--json FILE` is the old spelling of --json-file FILE.)",
)
@click.option(
    "--json-file",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write the JSON report to FILE (atomically).",
)
@click.option(
    "--simulate-worker", is_flag=True, help="Re-run with --worker inside the worker simulation (needs root)."
)
@click.option(
    "--platform",
    default=None,
    help="With --simulate-worker: the env's platform; linux-aarch64 on x86 runs an emulated aarch64 worker.",
)
@click.option("--fast", is_flag=True, help="bin/train's preflight subset: compilers, caches, node (seconds).")
@click.option(
    "--only",
    "only",
    multiple=True,
    metavar="CHECK[,CHECK]",
    help="Only these checks (names or patterns, e.g. compile.*) and the checks they need; the report "
    "lists just those. Not with --fast.",
)
@click.option(
    "--lockfile",
    type=click.Path(path_type=Path),
    help="Lock to compare with [default: the one the env was provisioned from].",
)
@click.option(
    "--mountinfo",
    type=click.Path(exists=True, dir_okay=False),
    help="Mount table to read instead of /proc/self/mountinfo.",
)
def main(
    env_name, prefix, worker, as_json, json_file, simulate_worker, platform, fast, only, lockfile, mountinfo
) -> None:
    """Prove an env on this node before a job is queued; exit 0 only if no check FAILed."""
    if env_name and prefix:
        raise click.UsageError("give --env NAME or --prefix PATH, not both")
    only = only_patterns(only)
    if only and fast:
        raise click.UsageError("give --fast or --only, not both (--only names the checks itself)")
    if as_json not in (None, "-"):  # the old `--json FILE`: the file, text on stdout
        click.echo(f"envcheck: `--json {as_json}` is deprecated: use `--json-file {as_json}`", err=True)
        json_file, as_json = json_file or Path(as_json), None
    as_json = as_json == "-"
    if simulate_worker:
        params = {
            **click.get_current_context().params,
            "as_json": as_json,
            "json_file": json_file,
            "only": only,
        }
        sys.exit(_simulate(params))
    if prefix:
        chosen_by = "--prefix"
    elif env_name:
        chosen_by = "--env"
    else:
        chosen_by = "the active env ($CONDA_PREFIX)" if os.environ.get("CONDA_PREFIX") else "the default env"
    target = resolve_prefix(env_name, prefix)
    text_stream = sys.stderr if as_json else sys.stdout

    def progress(line: str) -> None:
        print(f"envcheck: {line}", file=sys.stderr, flush=True)

    _stop_on_signals()
    try:
        report = run_checks(
            target,
            worker=worker,
            fast=fast,
            only=only,
            lockfile=lockfile,
            mountinfo=mountinfo,
            progress=progress,
            chosen_by=chosen_by,
        )
    except Stopped as stopped:
        code = 128 + stopped.signum
        said = f"stopped by {stopped} before every check ran: nothing is proven; run it again"
        click.echo(f"envcheck: {said}", err=True)
        JsonRequest(stdout=as_json, file=Path(json_file) if json_file else None).emit(
            outcome(code, error=said)
        )
        sys.exit(code)
    print(report.render(), end="", file=text_stream, flush=True)
    code = 0 if report.ok else 1
    if json_file:
        Path(json_file).parent.mkdir(parents=True, exist_ok=True)
    written = JsonRequest(stdout=as_json, file=Path(json_file) if json_file else None).emit(
        outcome(code, report.to_dict())
    )
    sys.exit(code if written else max(code, 1))


if __name__ == "__main__":
    run_click(main, "bin/envcheck", legacy_json_file=True)
