"""Install exactly the locked records into an env, atomically and idempotently.

Atomicity. conda packages bake their install path into files (shebangs, pkg-config files, python's
sysconfig), so a prefix cannot be built in a staging directory and renamed into place. Instead every
provision builds a new *generation* in place, `<envs>/.<name>.gens/<id>/`, and the env's name is a
symlink to the current generation:

    1. build the generation: verified conda packages (py-rattler, no re-solve), hooks, pip part;
    2. write the completion manifest LAST (prefix.completeness accepts nothing without it);
    3. point a new symlink at it and rename() it over `<envs>/<name>` (atomic: no moment without an env);
    4. delete the previous generation.

A provision killed at any point leaves the name pointing at the previous good generation (or at the
complete new one), plus an unreferenced directory that the next provision deletes. One provision at a
time per env (flock next to it).

Idempotence. The manifest records a state hash of the lock file, the platform, the env's variables,
the hook templates and this project's sources; when the current env's matches, nothing is done.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from provision import hooks
from provision import prefix as prefixes
from provision.atomic import fsync_dir, write_json_atomic
from provision.envvars import EnvVar, format_env_vars
from provision.lock import LockError, LockHeader, check_lock, current_platform, run_async
from provision.spec import EnvSpec, check_env_name

INSTALLERS = ("rattler", "conda", "mamba", "micromamba")


class ProvisionError(RuntimeError):
    """A provision that cannot go on; the message names the file and the fix. The env is untouched."""


def default_cache_dir() -> Path:
    """$LINGBOT_PKGS_DIR, else $XDG_CACHE_HOME/lingbot-provision (~/.cache/...): downloads + extracted pkgs."""
    if os.environ.get("LINGBOT_PKGS_DIR"):
        return Path(os.environ["LINGBOT_PKGS_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "lingbot-provision"


@dataclass
class Progress:
    """Per-phase progress lines on stderr (a batch log stays readable, unlike a redrawn bar)."""

    enabled: bool = True
    stream: object = sys.stderr
    started: float = field(default_factory=time.monotonic)

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(
                f"[provision {time.monotonic() - self.started:6.1f}s] {message}", file=self.stream, flush=True
            )


class _LinkReporter:
    """py-rattler InstallerReporter: a line per linked package."""

    def __init__(self, progress: Progress, total: int):
        self.progress, self.total, self.done, self.names = progress, total, 0, {}

    def on_link_start(self, operation: int, package_name: str) -> int:
        self.names[operation] = package_name
        return operation

    def on_link_complete(self, index: int) -> None:
        self.done += 1
        self.progress(f"link {self.done}/{self.total} {self.names.get(index, '')}")


# --- what to build --------------------------------------------------------------------------------


def _project_files(path: Path) -> list[Path]:
    """The files that make up a local pip project: its build config and its packages' sources."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard"],
            cwd=path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
        files = [path / f for f in listed if f]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in path.rglob("*") if p.is_file() and not any(s.startswith(".") for s in p.parts)]
    packages = {
        p.relative_to(path).parts[0]
        for p in files
        if p.name == "__init__.py" and len(p.relative_to(path).parts) == 2
    }
    keep = {"pyproject.toml", "setup.py", "setup.cfg"}
    return sorted(
        p
        for p in files
        if p.is_file() and (p.name in keep and p.parent == path or p.relative_to(path).parts[0] in packages)
    )


def project_digest(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for root in paths:
        for f in _project_files(root):
            digest.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


@dataclass
class Plan:
    spec: EnvSpec
    lock_path: Path
    header: LockHeader
    platform: str
    target: Path
    entries: list[EnvVar]
    state_hash: str


def plan(spec: EnvSpec, name: str | None, lock_path: Path, target: Path, platform: str | None = None) -> Plan:
    """Everything checked before anything is touched: env name, lock platform, drift."""
    check_env_name(spec, name)
    platform = platform or current_platform()
    header = check_lock(spec, lock_path, platform)
    entries = spec.env_var_entries(platform)
    state = {
        "lock_sha256": header.sha256,
        "platform": platform,
        "env_vars": format_env_vars(entries),
        "hooks": hooks.hooks_version(),
        "project": project_digest(spec.pip_local) if spec.pip_local else "",
    }
    state_hash = hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()
    return Plan(spec, Path(lock_path), header, platform, Path(target), entries, state_hash)


def up_to_date(p: Plan) -> bool:
    ok, _ = prefixes.completeness(p.target)
    return ok and prefixes.read_manifest(p.target).get("state_hash") == p.state_hash


# --- package files --------------------------------------------------------------------------------


def _hash_file(path: Path) -> tuple[str, str]:
    md5, sha256 = hashlib.md5(), hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            md5.update(chunk)
            sha256.update(chunk)
    return md5.hexdigest(), sha256.hexdigest()


def redirect(url: str, mirror: str | None) -> str:
    """The package's URL on `mirror` (same subdir/filename layout as any conda channel)."""
    if not mirror:
        return url
    parts = url.rstrip("/").split("/")
    mirror = mirror if "://" in mirror else Path(mirror).expanduser().resolve().as_uri()
    return f"{mirror.rstrip('/')}/{parts[-2]}/{parts[-1]}"


def fetch_verified(url: str, md5: str, sha256: str, downloads: Path, progress: Progress) -> Path:
    """A local file for `url` whose md5 and sha256 match the lock, else ProvisionError naming it.
    py-rattler does not check file:// packages, so every package is checked here before linking."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        path = Path(urllib.request.url2pathname(parsed.path))
        if not path.is_file():
            raise ProvisionError(f"package file {path} does not exist (from {url}); check --channel")
    elif parsed.scheme in ("http", "https"):
        path = downloads / sha256 / Path(parsed.path).name
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(path.name + f".part{os.getpid()}")
            progress(f"download {url}")
            try:
                with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
                    shutil.copyfileobj(response, out, 1 << 20)
            except OSError as exc:
                partial.unlink(missing_ok=True)
                raise ProvisionError(
                    f"cannot download {url}: {exc}; use --channel to point at a mirror"
                ) from None
            os.replace(partial, path)
    else:
        raise ProvisionError(f"unsupported package URL {url} (file, http and https only)")
    got_md5, got_sha256 = _hash_file(path)
    if (got_md5, got_sha256) != (md5, sha256):
        raise ProvisionError(
            f"package file {path} does not match the lock: md5 {got_md5} (lock {md5}), sha256 {got_sha256} "
            f"(lock {sha256}); the file is corrupt or was tampered with: nothing was installed. Replace it from a "
            f"trusted channel{' (and delete this cached copy)' if parsed.scheme != 'file' else ''}"
        )
    return path


def locked_records(p: Plan, mirror: str | None, downloads: Path, progress: Progress) -> list:
    """The lock's conda records for the platform, each pointing at a verified local file."""
    import rattler

    try:
        lock = rattler.LockFile.from_path(p.lock_path)
    except Exception as exc:
        raise LockError(f"{p.lock_path}: py-rattler cannot read it ({exc}); relock with --relock") from None
    platform = next((pl for pl in lock.platforms() if pl.name == p.platform), None)
    records = lock.default_environment().conda_repodata_records_for_platform(platform) if platform else None
    if not records:
        raise LockError(f"{p.lock_path} has no conda packages for {p.platform}; relock with --relock")
    for i, rec in enumerate(records, 1):
        if rec.md5 is None or rec.sha256 is None:
            raise LockError(f"{p.lock_path}: {rec.file_name} lacks md5 or sha256; relock with --relock")
        path = fetch_verified(redirect(rec.url, mirror), rec.md5.hex(), rec.sha256.hex(), downloads, progress)
        # the lock's v1 format has no noarch field (rattler guesses it from the build string): take it
        # from the verified archive itself, and make sure the archive is the package the lock names
        index = rattler.IndexJson.from_package_archive(path)
        if (index.name.normalized, str(index.version), str(index.build)) != (
            rec.name.normalized,
            str(rec.version),
            str(rec.build),
        ):
            raise ProvisionError(
                f"package file {path} holds {index.name.normalized} {index.version} "
                f"{index.build}, not {rec.file_name} as the lock says"
            )
        rec.noarch = index.noarch
        rec.url = path.resolve().as_uri()
        progress(f"verified {i}/{len(records)} {rec.file_name}")
    return records


def pip_entries(p: Plan) -> list:
    """The lock's pip packages for the platform (read with conda-lock's own parser)."""
    from conda_lock.lockfile import parse_conda_lock_file

    try:
        lock = parse_conda_lock_file(p.lock_path)
    except Exception as exc:  # pydantic's ValidationError and friends: the file is not a valid lock
        raise LockError(f"{p.lock_path}: conda-lock cannot parse it ({exc}); relock with --relock") from None
    return sorted(
        (d for d in lock.package if d.manager == "pip" and d.platform == p.platform), key=lambda d: d.name
    )


# --- building a generation ------------------------------------------------------------------------


def _link_conda(records: list, gen: Path, installer: str, cache_dir: Path, progress: Progress) -> None:
    if installer == "rattler":
        import rattler

        cache = rattler.PackageCache.new_layered(
            [cache_dir / "pkgs"], validation_mode=rattler.ValidationMode.fast()
        )
        run_async(
            rattler.install(
                records,
                target_prefix=gen,
                package_cache=cache,
                show_progress=False,
                reporter=_LinkReporter(progress, len(records)),
                execute_link_scripts=False,
            )
        )
        return
    exe = shutil.which(installer)
    if exe is None:
        raise ProvisionError(f"--installer {installer}: {installer} is not on PATH; use --installer rattler")
    # an explicit file of the verified local packages: no solve, same files
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("@EXPLICIT\n" + "".join(f"{r.url}#{r.md5.hex()}\n" for r in records))
    try:
        proc = subprocess.run([exe, "create", "--yes", "--prefix", str(gen), "--file", f.name])
    finally:
        os.unlink(f.name)
    if proc.returncode != 0:
        raise ProvisionError(f"{installer} create failed (exit {proc.returncode}); see its output above")


def _pip_install(
    p: Plan, gen: Path, entries: list, index: str | None, find_links: str | None, progress: Progress
) -> list[dict]:
    if not entries and not p.spec.pip_local:
        return []
    python = gen / "bin" / "python"
    if not python.exists():
        if entries:
            raise ProvisionError(
                f"{p.lock_path} has a pip part but the env has no bin/python; add python to "
                f"{p.spec.path} and relock"
            )
        progress(f"no python in the env: skipping the pip install of {', '.join(map(str, p.spec.pip_local))}")
        return []
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PYTHONNOUSERSITE": "1"}
    base = [
        str(python),
        "-m",
        "pip",
        "install",
        "--isolated",
        "--no-deps",
        "--disable-pip-version-check",
        "--no-warn-script-location",
    ]
    if entries:
        lines = []
        for d in entries:
            sha = f"--hash=sha256:{d.hash.sha256}"
            # the locked file by URL; with a mirror, the same version and hash from there
            lines.append(
                f"{d.name}=={d.version} {sha}" if (index or find_links) else f"{d.name} @ {d.url} {sha}"
            )
        reqs = gen / "conda-meta" / "lingbot-pip-requirements.txt"
        reqs.write_text("\n".join(lines) + "\n")
        cmd = base + ["--require-hashes", "-r", str(reqs)]
        if index:
            cmd += ["--index-url", index]
        if find_links:
            cmd += ["--no-index", "--find-links", find_links]
        progress(f"pip: installing {len(entries)} locked packages with hashes")
        if subprocess.run(cmd, env=env).returncode != 0:
            raise ProvisionError(
                "pip install of the locked pip part failed (output above); the env is untouched"
            )
    for local in p.spec.pip_local:
        progress(f"pip: installing {local} (--no-deps)")
        if subprocess.run(base + ["--no-build-isolation", "--no-index", str(local)], env=env).returncode != 0:
            raise ProvisionError(f"pip install of {local} failed (output above); the env is untouched")
    return [{"name": d.name, "version": d.version, "sha256": d.hash.sha256} for d in entries]


def _write_manifest(p: Plan, gen: Path, records: list, pip: list, installer: str, seconds: float) -> None:
    files = [f"conda-meta/{r.name.normalized}-{r.version}-{r.build}.json" for r in records]
    files += [str(rel) for rel in (hooks.ENV_VARS_RELPATH, hooks.ACTIVATE_RELPATH, hooks.DEACTIVATE_RELPATH)]
    manifest = {
        "format": prefixes.MANIFEST_FORMAT,
        "complete": True,
        "env_name": p.spec.name,
        "prefix": str(p.target),
        "generation": os.path.realpath(gen),
        "platform": p.platform,
        "state_hash": p.state_hash,
        "lock_content_hash": p.header.content_hash[p.platform],
        "lock_sha256": p.header.sha256,
        "lockfile": str(p.lock_path),
        "spec": str(p.spec.path),
        "hooks_version": hooks.hooks_version(),
        "installer": installer,
        "packages": [
            {
                "name": r.name.normalized,
                "version": str(r.version),
                "build": str(r.build),
                "sha256": r.sha256.hex(),
            }
            for r in records
        ],
        "pip": pip,
        "files": files,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(seconds, 3),
    }
    write_json_atomic(prefixes.manifest_path(gen), manifest, indent=1, sort_keys=False)


def generations_dir(target: Path) -> Path:
    return target.parent / f".{target.name}.gens"


@contextlib.contextmanager
def _env_lock(target: Path):
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.provision.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released by the kernel if we are killed
        yield


def _clean_stale(target: Path, keep: str | None, progress: Progress) -> None:
    """Remove what killed provisions left and generations older than the current one: everything but
    `keep` (the generation the name points at now, which becomes the previous one), half-made symlinks."""
    gens = generations_dir(target)
    for entry in sorted(gens.iterdir()) if gens.is_dir() else []:
        if os.path.realpath(entry) != keep:
            progress(f"removing leftover {entry}")
            shutil.rmtree(entry, ignore_errors=True)
    for leftover in target.parent.glob(f".{target.name}.link-*"):
        leftover.unlink(missing_ok=True)


def provision(
    p: Plan,
    *,
    installer: str = "rattler",
    mirror: str | None = None,
    cache_dir: Path | None = None,
    pip_index: str | None = None,
    pip_find_links: str | None = None,
    force: bool = False,
    progress: Progress | None = None,
    before_swap: Callable[[Path], None] | None = None,
) -> dict:
    """Build `p` into a new generation and swap it in; a no-op when the env is up to date."""
    progress = progress or Progress()
    cache_dir = Path(cache_dir or default_cache_dir())
    target = p.target
    started = time.monotonic()
    if installer not in INSTALLERS:
        raise ProvisionError(f"--installer {installer}: choose one of {', '.join(INSTALLERS)}")
    if not force and up_to_date(p):  # fast path, before taking the lock
        return {
            "action": "up-to-date",
            "prefix": str(target),
            "seconds": round(time.monotonic() - started, 3),
        }
    with _env_lock(target):
        if not force and up_to_date(p):  # another provision just finished it
            return {
                "action": "up-to-date",
                "prefix": str(target),
                "seconds": round(time.monotonic() - started, 3),
            }
        if target.exists() and not target.is_symlink():
            if target.is_dir() and not any(target.iterdir()):
                target.rmdir()
            else:
                raise ProvisionError(
                    f"{target} exists and was not made by bin/provision (it is not a symlink to a generation); "
                    f"remove it (rm -rf {target}) or choose another --prefix"
                )
        previous = os.path.realpath(target) if target.is_symlink() else None
        _clean_stale(target, previous, progress)

        # A fresh name every time: reusing one (same second, same state) could delete the live generation.
        gen = (
            generations_dir(target)
            / f"{time.strftime('%Y%m%d-%H%M%S')}-{p.state_hash[:8]}-{secrets.token_hex(4)}"
        )
        gen.parent.mkdir(parents=True, exist_ok=True)
        progress(f"building {target} as {gen.name} from {p.lock_path.name} ({p.platform})")
        try:
            records = locked_records(p, mirror, cache_dir / "downloads", progress)
            _link_conda(records, gen, installer, cache_dir, progress)
            hooks.write_env_files(gen, p.entries, str(p.spec.path))
            pip = _pip_install(p, gen, pip_entries(p), pip_index, pip_find_links, progress)
            _write_manifest(p, gen, records, pip, installer, time.monotonic() - started)
            fsync_dir(gen / "conda-meta")
            if before_swap is not None:
                before_swap(gen)
        except BaseException:
            shutil.rmtree(gen, ignore_errors=True)  # a failure leaves nothing (a kill: the next run cleans)
            raise

        link = target.parent / f".{target.name}.link-{os.getpid()}"
        link.unlink(missing_ok=True)
        link.symlink_to(os.path.relpath(gen, target.parent))
        os.replace(link, target)  # the atomic switch
        fsync_dir(target.parent)
        # The previous generation stays until the next provision: jobs started from it keep running.
        ok, reason = prefixes.completeness(target)
        if not ok:
            raise ProvisionError(f"internal error: the new env is not complete: {reason}")
        return {
            "action": "provisioned",
            "prefix": str(target),
            "generation": str(gen),
            "packages": len(records),
            "pip": len(pip),
            "seconds": round(time.monotonic() - started, 3),
        }
