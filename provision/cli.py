"""bin/provision: build the env declared in environment.yml from conda-lock.yml.

bin/provision lingbot-b200                   install/refresh the env (a no-op when up to date)
bin/provision lingbot-b200 --relock          re-solve environment.yml into conda-lock.yml
bin/provision lingbot-b200 --channel DIR     install from a mirror or local channel
bin/provision lingbot-b200 --export DIR      download + verify the locked packages into DIR (offline kit)
bin/provision lingbot-b200 --from DIR        install from such a DIR on a node that reaches nothing
bin/provision myenv --lockfile conda-lock.yml [--file environment.yml]   any conda-lock v1 file

--json (on bin/provision, bin/envcheck and bin/train alike): stdout carries exactly one JSON object,
the command's result (on an error {"ok": false, "error": ...}); progress and text go to stderr; the
exit status does not change.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

import click

from provision import prefix as prefixes
from provision import vpkgs
from provision.export import ExportError, export, from_dir
from provision.install import INSTALLERS, Progress, ProvisionError, default_cache_dir, plan, provision
from provision.jsonout import JsonRequest, outcome, run_click
from provision.lock import PYPI_INDEX, LockError, check_lock, current_platform, default_mirrors, make_lock
from provision.lockfile import read_lock
from provision.spec import (
    EnvSpec,
    SpecError,
    check_env_name,
    default_spec,
    load_spec,
    provision_command,
    valid_env_name,
)
from provision.vpkgs import VirtualPackagesError


def _fail(message: str, request: JsonRequest) -> None:
    click.echo(f"provision: error: {message}", err=True)
    request.emit(outcome(2, error=message))
    sys.exit(2)


def _stop_on_sigterm(signum: int, _frame: object) -> None:
    """SIGTERM as an exception: every `except BaseException` / `finally` on the way out runs (an export's
    DIR.partial-<pid>, a half-built generation), then exit 128 + 15."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the cleanup is not interrupted again
    print("bin/provision: stopped by SIGTERM; nothing half-made is kept", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


def _spec_for(spec_file: Path | None, lockfile: Path | None, name: str | None = None) -> EnvSpec | None:
    """--file, else (with --lockfile) the source the lock records beside it, else this checkout's spec.
    None: a lock with no environment.yml at hand (installed with a warning). `name` (the command's NAME)
    names a spec that has no `name:`."""
    if spec_file is not None:
        return load_spec(spec_file, unnamed=name)
    if lockfile is None:
        return load_spec(default_spec())
    import yaml

    sources: list = []
    try:
        sources = (yaml.safe_load(Path(lockfile).read_text()) or {}).get("metadata", {}).get("sources") or []
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        pass  # the lock's own reader says what is wrong with it
    for source in sources:
        candidate = Path(lockfile).absolute().parent / str(source)
        if candidate.name.endswith((".yml", ".yaml")) and candidate.is_file():
            return load_spec(candidate, unnamed=name)
    return None


def _relock_vpkgs(spec: EnvSpec, vp_file: Path | None, overrides: dict[str, str | None], log) -> dict:
    """The virtual packages per platform for --relock: the file (default: virtual-packages.yml beside
    the spec), else bin/provision's defaults; --glibc/--cuda/--linux override single values."""
    path = vp_file or spec.path.parent / vpkgs.DEFAULT_FILE_NAME
    if vp_file is not None or path.is_file():
        by_platform = vpkgs.read_spec_file(path)
        log(f"virtual packages from {path}")
    else:
        by_platform = {p: vpkgs.platform_default(p) for p in spec.platforms}
    given = {k: v for k, v in overrides.items() if v is not None}
    if given:
        from dataclasses import replace

        by_platform = {p: replace(v, **given) for p, v in by_platform.items()}
        log(f"virtual packages overridden on the command line: {given} (not written to {path})")
    return by_platform


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("name", required=False)
@click.option(
    "-f",
    "--file",
    "spec_file",
    type=click.Path(path_type=Path),
    default=None,
    help="environment.yml declaring the env [default: this checkout's; with --lockfile, the "
    "source the lock names beside it, else none: drift is not checked].",
)
@click.option(
    "--lockfile",
    type=click.Path(path_type=Path),
    default=None,
    help="conda-lock v1 file (ours or conda-lock's) [default: conda-lock.yml next to the spec].",
)
@click.option(
    "-p",
    "--prefix",
    type=click.Path(path_type=Path),
    default=None,
    help="Env location [default: NAME under $CONDA_ENVS_PATH, else ~/.conda/envs].",
)
@click.option("--relock", is_flag=True, help="Solve the spec and (re)write the lock file, then stop.")
@click.option(
    "--virtual-package-spec",
    "vp_file",
    type=click.Path(path_type=Path),
    default=None,
    help="conda-lock's --virtual-package-spec file [default: virtual-packages.yml beside the spec]: "
    "--relock solves with it; install uses it for the drift check of a lock that records none.",
)
@click.option(
    "--channel",
    "channels",
    multiple=True,
    help="Mirror or local channel (URL or directory) to use instead of the spec's channel: "
    "repodata for --relock, package files for install. Repeat per spec channel for --relock.",
)
@click.option(
    "--export",
    "export_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Download and verify exactly the locked packages into a new DIR (channel + wheels), then stop.",
)
@click.option(
    "--from",
    "from_dir_",
    type=click.Path(path_type=Path),
    default=None,
    help="Install from an --export DIR (no network needed).",
)
@click.option(
    "--installer",
    type=click.Choice(INSTALLERS),
    default="rattler",
    show_default=True,
    help="What links the conda packages (others only when on PATH); never a re-solve.",
)
@click.option("--glibc", default=None, help="--relock: override __glibc of the virtual-package file.")
@click.option("--cuda", default=None, help="--relock: override __cuda ('' for none).")
@click.option("--linux", "linux_version", default=None, help="--relock: override __linux (kernel).")
@click.option("--pip-index", default=None, help=f"PyPI mirror (simple index) [default: {PYPI_INDEX}].")
@click.option("--pip-find-links", default=None, help="Install: a directory of the locked wheels (no index).")
@click.option(
    "--cache-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Package downloads and extracted packages [default: $LINGBOT_PKGS_DIR, else "
    "~/.cache/lingbot-provision].",
)
@click.option("--platform", "platform_name", default=None, help="Target platform [default: this machine's].")
@click.option("--no-project", is_flag=True, help="Do not pip-install this checkout into its env.")
@click.option("--force", is_flag=True, help="Rebuild even when the env is up to date.")
@click.option("--json", "as_json", is_flag=True, help="Exactly one JSON object on stdout; text on stderr.")
@click.option(
    "--json-file", type=click.Path(path_type=Path), default=None, help="Write that JSON object to FILE."
)
@click.option("-q", "--quiet", is_flag=True, help="No progress lines on stderr.")
def main(**opts) -> None:
    """Provision the conda env NAME (default: the spec's name) exactly as locked."""
    steps = (("--relock", "relock"), ("--export", "export_dir"), ("--from", "from_dir_"))
    actions = [flag for flag, key in steps if opts[key]]
    if len(actions) > 1:
        raise click.UsageError(f"{' and '.join(actions)} are separate steps: give one per command")
    request = JsonRequest(stdout=opts["as_json"], file=opts["json_file"])
    signal.signal(signal.SIGTERM, _stop_on_sigterm)  # a time limit, kill: clean up as Ctrl-C does
    request.capture_stdout()  # pip's and the installers' output goes to stderr: stdout is the object alone
    progress = Progress(enabled=not opts["quiet"])
    try:
        summary = _dispatch(opts, progress)
    except (
        SpecError,
        LockError,
        ProvisionError,
        ExportError,
        VirtualPackagesError,
        FileNotFoundError,
    ) as exc:
        _fail(str(exc), request)
        return
    except OSError as exc:  # e.g. --prefix under a file, a read-only envs dir: name the path
        path = Path(exc.filename) if exc.filename else None
        blocker = next((p for p in (path, *path.parents) if p.is_file()), None) if path else None
        if blocker is not None:  # was "<path>: File exists", with no fix
            _fail(
                f"{blocker} is a file, so the env's folder cannot be made there; choose another --prefix",
                request,
            )
        else:
            _fail(f"{exc.filename or ''}: {exc.strerror or exc}", request)
        return
    line = summary.pop("_line")
    if not request.stdout:
        click.echo(f"provision: {line}")
    if not request.emit(outcome(0, summary)):
        sys.exit(1)


def _dispatch(opts: dict, progress: Progress) -> dict:
    try:
        return _dispatch_named(opts, progress)
    except LockError as exc:  # the lock reader does not know the env's name: put it into the fix
        name = opts["name"] or _spec_name_or_none(opts)
        raise LockError(
            str(exc).replace("bin/provision NAME", f"bin/provision {name}") if name else str(exc)
        ) from None


def _spec_name_or_none(opts: dict) -> str | None:
    try:
        spec = _spec_for(opts["spec_file"], opts["lockfile"], opts["name"])
    except (SpecError, OSError):
        return None
    return spec.name if spec else None


def _dispatch_named(opts: dict, progress: Progress) -> dict:
    name, lockfile = opts["name"], opts["lockfile"]
    if name is not None and not valid_env_name(name):
        raise SpecError(f"env name {name!r}: use letters, digits, . _ - only, the first a letter or digit")
    spec = _spec_for(opts["spec_file"], lockfile, name)
    if spec is not None:
        check_env_name(spec, name)
    if spec is None and not name:
        raise ProvisionError(
            f"{lockfile}: no environment.yml at hand; name the env: bin/provision NAME --lockfile {lockfile}"
        )
    env_name = name or (spec.name if spec else "")
    lock_path = Path(lockfile) if lockfile else (spec.path.parent if spec else Path.cwd()) / "conda-lock.yml"
    channels = list(opts["channels"])
    if opts["relock"]:
        if spec is None:
            raise ProvisionError("--relock needs the environment.yml to solve: pass --file")
        by_platform = _relock_vpkgs(
            spec,
            opts["vp_file"],
            {"glibc": opts["glibc"], "cuda": opts["cuda"], "linux": opts["linux_version"]},
            progress,
        )
        summary = make_lock(
            spec,
            lock_path,
            vpkgs_by_platform=by_platform,
            mirrors=channels or default_mirrors(spec),
            cache_dir=Path(opts["cache_dir"] or default_cache_dir()) / "repodata",
            pip_index=opts["pip_index"] or PYPI_INDEX,
            log=progress,
        )
        return {
            **summary,
            "_line": f"wrote {lock_path}; install it with `{provision_command(spec, lock_path)}`",
        }
    if len(channels) > 1:
        raise ProvisionError("install takes one --channel (the mirror holding the locked package files)")
    if opts["platform_name"] is not None and not opts["platform_name"].strip():
        raise ProvisionError("--platform needs a conda platform (e.g. linux-64, linux-aarch64), not ''")
    platform = opts["platform_name"] or current_platform()
    if opts["export_dir"] is not None:
        return _export(opts, spec, env_name, lock_path, platform, channels, progress)
    mirror, find_links = (channels[0] if channels else None), opts["pip_find_links"]
    if opts["from_dir_"] is not None:
        sources = from_dir(opts["from_dir_"], read_lock(lock_path), platform, env_name)
        mirror, find_links = sources.channel, sources.find_links or find_links
        progress(f"installing from the export {opts['from_dir_']} (channel {mirror}, wheels {find_links})")
    target = prefixes.resolve_prefix(name=env_name, prefix=opts["prefix"])
    the_plan = plan(
        spec,
        name,
        lock_path,
        target,
        platform,
        install_project=not opts["no_project"],
        vpkg_file=opts["vp_file"],
        log=progress,
    )
    summary = provision(
        the_plan,
        installer=opts["installer"],
        mirror=mirror,
        cache_dir=opts["cache_dir"],
        pip_index=opts["pip_index"],
        pip_find_links=find_links,
        force=opts["force"],
        progress=progress,
    )
    verb = "is up to date" if summary["action"] == "up-to-date" else "was provisioned"
    if not the_plan.spec_checked:
        summary["warning"] = f"no environment.yml for {lock_path}: drift was not checked"
    return {**summary, "_line": f"{summary['prefix']} {verb} ({summary['seconds']:.2f} s)"}


def _export(opts, spec, env_name, lock_path, platform, channels, progress) -> dict:
    if opts["pip_index"]:  # it was ignored, and its fetch error then advised --pip-find-links
        raise ProvisionError(
            "--export fetches the locked wheels by their URLs, or from --pip-find-links DIR (a folder of "
            "them); it does not search --pip-index: give --pip-find-links instead"
        )
    lock = check_lock(spec, lock_path, platform, vpkg_file=opts["vp_file"], log=progress)
    extra = []
    if spec is not None:
        extra.append(spec.path)
        beside = spec.path.parent / vpkgs.DEFAULT_FILE_NAME
        if beside.is_file():
            extra.append(beside)
    summary = export(
        lock,
        platform,
        env_name,
        opts["export_dir"],
        extra_files=extra,
        mirror=channels[0] if channels else None,
        downloads=Path(opts["cache_dir"] or default_cache_dir()) / "downloads",
        progress=progress,
        find_links=opts["pip_find_links"],
    )
    return {
        **summary,
        "_line": f"exported {summary['conda']} conda packages and {summary['pip']} wheels "
        f"to {summary['export']}; install with `bin/provision {env_name} --from {summary['export']}`",
    }


def _exit_as_the_process(done: SystemExit) -> NoReturn:
    """Leave with `done`'s code without the interpreter's finalization. py-rattler 0.28's tokio threads
    may still take the GIL (pyo3) after its coroutine returned; on Python < 3.14 a thread that does so
    while the interpreter finalizes is ended with pthread_exit, which aborts the process. Measured on a
    failed solve with normal finalization: 4 of 160 runs died after printing the whole error ("Fatal
    Python error: PyGILState_Release: ... must be current when releasing", SIGABRT / SIGBUS / SIGSEGV);
    through this exit, 0 of 240 (tests/test_spec_lock.py saw it twice, 2026-12-04). Everything it writes
    is written atomically and closed before run_click raises; stdio is flushed here. Only when this file
    is the process's program: run in-process (runpy, tests/test_doc_commands.py) it must never end the
    host (a long-lived host is past the race by the time it finalizes)."""
    if Path(sys.argv[0]).resolve() != Path(__file__).resolve():
        raise done
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:  # a reader that went away (`| head`)
            pass
    os._exit(done.code if isinstance(done.code, int) else (0 if done.code is None else 1))


if __name__ == "__main__":
    try:
        run_click(main, "bin/provision")
    except SystemExit as done:
        _exit_as_the_process(done)
