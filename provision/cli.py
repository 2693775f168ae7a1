"""bin/provision: build the env declared in environment.yml from conda-lock.yml.

bin/provision lingbot-b200                   install/refresh the env (a no-op when up to date)
bin/provision lingbot-b200 --relock          re-solve environment.yml into conda-lock.yml
bin/provision lingbot-b200 --channel DIR     install from a mirror or local channel (air-gapped)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from provision import prefix as prefixes
from provision.install import INSTALLERS, Plan, Progress, ProvisionError, default_cache_dir, plan, provision
from provision.lock import PYPI_INDEX, LockError, VirtualPackages, default_mirrors, make_lock
from provision.spec import DEFAULT_SPEC, SpecError, check_env_name, load_spec


def _fail(message: str, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"ok": False, "error": message}))
    click.echo(f"provision: error: {message}", err=True)
    sys.exit(2)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("name", required=False)
@click.option(
    "-f",
    "--file",
    "spec_file",
    type=click.Path(path_type=Path),
    default=DEFAULT_SPEC,
    show_default=True,
    help="environment.yml declaring the env (conda's format, one env).",
)
@click.option(
    "--lockfile",
    type=click.Path(path_type=Path),
    default=None,
    help="conda-lock v1 file [default: conda-lock.yml next to the spec].",
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
    "--channel",
    "channels",
    multiple=True,
    help="Mirror or local channel (URL or directory) to use instead of the spec's channel: "
    "repodata for --relock, package files for install. Repeat per spec channel for --relock.",
)
@click.option(
    "--installer",
    type=click.Choice(INSTALLERS),
    default="rattler",
    show_default=True,
    help="What links the conda packages (others only when on PATH); never a re-solve.",
)
@click.option(
    "--glibc", default=VirtualPackages.glibc, show_default=True, help="--relock: __glibc of the workers."
)
@click.option(
    "--cuda",
    default=VirtualPackages.cuda,
    show_default=True,
    help="--relock: __cuda of the cluster driver ('' for none).",
)
@click.option(
    "--linux",
    "linux_version",
    default=VirtualPackages.linux,
    show_default=True,
    help="--relock: __linux (kernel) of the workers.",
)
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
@click.option("--force", is_flag=True, help="Rebuild even when the env is up to date.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines on stderr.")
def main(
    name,
    spec_file,
    lockfile,
    prefix,
    relock,
    channels,
    installer,
    glibc,
    cuda,
    linux_version,
    pip_index,
    pip_find_links,
    cache_dir,
    platform_name,
    force,
    as_json,
    quiet,
):
    """Provision the conda env NAME (default: the spec's name) exactly as locked."""
    progress = Progress(enabled=not quiet)
    try:
        spec = load_spec(spec_file)
        check_env_name(spec, name)
        lock_path = Path(lockfile) if lockfile else spec.path.parent / "conda-lock.yml"
        if relock:
            mirrors = list(channels) or default_mirrors(spec)
            vpkgs = VirtualPackages(glibc=glibc, cuda=cuda, linux=linux_version)
            summary = make_lock(
                spec,
                lock_path,
                vpkgs=vpkgs,
                mirrors=mirrors,
                cache_dir=Path(cache_dir or default_cache_dir()) / "repodata",
                pip_index=pip_index or PYPI_INDEX,
                log=progress,
            )
            summary["ok"] = True
            _report(summary, as_json, f"wrote {lock_path}; install it with `bin/provision {spec.name}`")
            return
        if len(channels) > 1:
            raise ProvisionError("install takes one --channel (the mirror holding the locked package files)")
        target = prefixes.resolve_prefix(name=spec.name, prefix=prefix)
        the_plan: Plan = plan(spec, name, lock_path, target, platform_name)
        summary = provision(
            the_plan,
            installer=installer,
            mirror=channels[0] if channels else None,
            cache_dir=cache_dir,
            pip_index=pip_index,
            pip_find_links=pip_find_links,
            force=force,
            progress=progress,
        )
        summary["ok"] = True
        verb = "is up to date" if summary["action"] == "up-to-date" else "was provisioned"
        _report(summary, as_json, f"{summary['prefix']} {verb} ({summary['seconds']:.2f} s)")
    except (SpecError, LockError, ProvisionError, FileNotFoundError) as exc:
        _fail(str(exc), as_json)
    except OSError as exc:  # e.g. --prefix under a file, a read-only envs dir: name the path
        _fail(f"{exc.filename or ''}: {exc.strerror or exc}", as_json)


def _report(summary: dict, as_json: bool, line: str) -> None:
    if as_json:
        click.echo(json.dumps(summary, indent=1, default=str))
    else:
        click.echo(f"provision: {line}")


if __name__ == "__main__":
    main(prog_name="bin/provision")
