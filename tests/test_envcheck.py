"""bin/envcheck on envs provisioned by bin/provision's own code from a local channel, inside the worker
simulation (no gcc, binutils, crt files or headers) and on this host (which has gcc).

Two envs are built once per session: `lingbot-test-bare` (only `lingbot-probe`) and `lingbot-test-tool`
(the same plus the toolchain stand-in: gcc_linux-64, gxx_linux-64, sysroot_linux-64). Neither has a
python, so the probes run with the tool python in the env's job environment (as the report says).

A warm Triton cache does not turn a missing compiler into a PASS: held by
test_worker_without_toolchain_fails_with_the_real_errors (its envcheck run goes over a cache warmed by the
toolchain env and proven to mask the missing compiler; the run FAILs compile.triton_build with "Failed to
find C compiler", its cache.triton_dir row names that cache, and the cache is left unchanged). The test
that held it alone with a `--fast` envcheck run of its own,
test_warm_triton_cache_does_not_turn_a_missing_compiler_into_a_pass, was merged into it (one run fewer).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from provision import install, lock, probes
from provision.check import FAIL, PASS, SKIP, STATUSES, WARN, scrubbed_environment
from provision.check.context import Context, Outcome
from provision.check.table import TABLE, CheckSpec, run_table, select
from provision.envvars import job_environment
from provision.spec import load_spec
from tests.support.channel import index_channel
from tests.support.hidden import without
from tests.support.ninja_pkg import ninja_package, openssl_package

REPO = Path(__file__).resolve().parents[1]
ENVCHECK = [sys.executable, "-m", "provision.check"]
GPU_CHECKS = ("gpu.cuda", "gpu.driver", "gpu.nccl", "gpu.kind")


@dataclass(frozen=True)
class Envs:
    bare: Path
    tool: Path


@pytest.fixture(scope="session")
def ninja_channel(tmp_path_factory) -> Path:
    """A channel with `ninja` (Debian's ninja-build binary), torch.utils.cpp_extension's build tool, and
    `openssl` (Debian's binary), which Inductor's CPU precompiled header runs."""
    channel = tmp_path_factory.mktemp("ninja-channel")
    (channel / "linux-64").mkdir()
    for pkg in (ninja_package(), openssl_package()):
        shutil.copy2(pkg, channel / "linux-64" / pkg.name)
    index_channel(channel)
    return channel


@pytest.fixture(scope="session")
def envs(toolchain_channel, ninja_channel, tmp_path_factory) -> Envs:
    """Both envs, locked and provisioned exactly as `bin/provision --relock` + `bin/provision` do."""
    root = tmp_path_factory.mktemp("envcheck-envs")
    prefixes = {}
    for kind, deps, channels in (
        ("bare", ["lingbot-probe"], [toolchain_channel]),
        ("tool", ["lingbot-probe", "gcc_linux-64", "gxx_linux-64", "sysroot_linux-64", "ninja", "openssl"],
         [toolchain_channel, ninja_channel]),
    ):  # fmt: skip
        spec_dir = root / kind
        spec_dir.mkdir()
        spec_path = spec_dir / "environment.yml"
        spec_path.write_text(
            f"name: lingbot-test-{kind}\nchannels:\n"
            + "".join(f"  - {c}\n" for c in channels)
            + "dependencies:\n"
            + "".join(f"  - {d}\n" for d in deps)
            + "variables:\n  LINGBOT_GPU_KIND: b200\n"
            "  TRITON_CACHE_DIR: ${HOME}/.triton/cache_lingbot-test_${LINGBOT_GPU_KIND}\n"
        )
        spec = load_spec(spec_path)
        lock_path = spec_dir / "conda-lock.yml"
        lock.make_lock(spec, lock_path, vpkgs_by_platform={"linux-64": lock.VirtualPackages(cuda="")},
                       mirrors=None,
                       cache_dir=root / "rattler-cache", log=lambda _: None)  # fmt: skip
        plan = install.plan(spec, spec.name, lock_path, root / "envs" / spec.name)
        install.provision(plan, cache_dir=root / "pkgs", progress=install.Progress(enabled=False))
        prefixes[kind] = plan.target
    return Envs(**prefixes)


def envcheck(runner, *args: str, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    """bin/envcheck's module, run by `runner` (the worker simulation or plain subprocess)."""
    argv = [*ENVCHECK, *args]
    if runner is None:
        return subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    return runner.run(argv, env=env, cwd=REPO, timeout=timeout)


def by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def assert_report_shape(report: dict) -> None:
    assert report["format"] == 1
    for key, kind in (("prefix", str), ("env_name", str), ("worker", bool), ("fast", bool), ("node", str),
                      ("started", str), ("seconds", float), ("ok", bool), ("failed", list), ("counts", dict),
                      ("summary", str), ("checks", list)):  # fmt: skip
        assert isinstance(report[key], kind), key
    names = [c["name"] for c in report["checks"]]
    assert len(names) == len(set(names))
    for check in report["checks"]:
        assert set(check) == {"name", "status", "seconds", "message", "fix", "details"}
        assert check["status"] in STATUSES and check["seconds"] >= 0 and check["message"]
        if check["status"] == FAIL:
            assert check["fix"], f"{check['name']} FAILs without a fix"
    assert report["failed"] == [c["name"] for c in report["checks"] if c["status"] == FAIL]
    assert report["ok"] is (not report["failed"])
    assert sum(report["counts"].values()) == len(names)


def inside(path: str, prefix: Path) -> bool:
    return os.path.realpath(path).startswith(os.path.realpath(prefix) + os.sep)


# --- host only, no env needed ---------------------------------------------------------------------


@pytest.mark.fast
def test_missing_env_fails_with_the_provision_fix(tmp_path):
    proc = subprocess.run([*ENVCHECK, "--prefix", str(tmp_path / "lingbot-gone"), "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert_report_shape(report)
    assert report["failed"] == ["env.prefix"]
    # a command to run as written: the spec's env name, this prefix
    assert f"bin/provision lingbot-b200 --prefix {tmp_path / 'lingbot-gone'}" in report["checks"][0]["fix"]
    assert "envcheck: FAILED env.prefix" in proc.stderr.splitlines()[-1]


@pytest.mark.fast
@pytest.mark.parametrize("flags", [["--json"], ["--json", "-"]])
def test_one_json_convention_stdout_is_one_object(tmp_path, flags):
    """--json on bin/envcheck and bin/provision alike: stdout is exactly one JSON object, text on stderr,
    the exit status unchanged (`--json -`, what trainer/sbatch.py writes, is the same)."""
    gone = str(tmp_path / "gone")
    proc = subprocess.run([*ENVCHECK, "--prefix", gone, *flags], cwd=REPO, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 1 and json.loads(proc.stdout)["failed"] == ["env.prefix"]
    assert "envcheck: FAILED env.prefix" in proc.stderr
    filed = tmp_path / "report.json"
    proc = subprocess.run([*ENVCHECK, "--prefix", gone, "--json-file", str(filed)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and "FAIL" in proc.stdout and json.loads(filed.read_text())["ok"] is False
    prov = subprocess.run([sys.executable, "-m", "provision.cli", "not-the-env", "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert prov.returncode == 2
    assert json.loads(prov.stdout) == {
        "ok": False,
        "exit_code": 2,
        "error": prov.stderr.split("provision: error: ", 1)[1].strip(),
    }
    assert json.loads(filed.read_text())["exit_code"] == 1  # the report carries the exit status too
    prov_file = tmp_path / "provision.json"
    argv = [sys.executable, "-m", "provision.cli", "not-the-env", "--json-file", str(prov_file)]
    prov = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert prov.returncode == 2 and prov.stdout == "" and json.loads(prov_file.read_text())["exit_code"] == 2


@pytest.mark.fast
@pytest.mark.parametrize(
    "command", [ENVCHECK, [sys.executable, "-m", "provision.cli"]], ids=["envcheck", "provision"]
)
@pytest.mark.parametrize("bad", [["--no-such-flag"], ["--env", "a", "--prefix", "/x"]], ids=["flag", "both"])
def test_a_bad_command_line_is_json_too(tmp_path, command, bad):
    """The same object as bin/train's for a bad command line: {"ok": false, "exit_code": 2, "error"}."""
    if command is not ENVCHECK and bad[0] == "--env":  # two actions at once: refused before doing either
        bad = ["--relock", "--export", str(tmp_path / "kit")]
    proc = subprocess.run([*command, *bad, "--json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    obj = json.loads(proc.stdout)
    assert obj == {"ok": False, "exit_code": 2, "error": obj["error"]} and obj["error"]
    assert "rror" in proc.stderr  # the text goes to stderr as without --json


@pytest.mark.fast
def test_ctrl_c_is_exit_130_and_under_json_the_error_object(capfd):
    """bin/provision, bin/envcheck, bin/evaluate and bin/serve (run_click): Ctrl-C was "Aborted!", exit 1
    (which says "failed") and no JSON object under --json."""
    import click

    from provision.jsonout import run_click

    @click.command()
    @click.option("--json", "as_json", is_flag=True)
    def interrupted(as_json: bool) -> None:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as done:
        run_click(interrupted, "bin/x", ["--json"])
    out, err = capfd.readouterr()  # the object is written to fd 1 itself
    assert done.value.code == 130 and "bin/x: stopped by SIGINT (Ctrl-C)" in err
    assert json.loads(out) == {"ok": False, "exit_code": 130, "error": "stopped by SIGINT (Ctrl-C)"}


@pytest.mark.fast
def test_env_and_prefix_together_is_a_usage_error(tmp_path):
    proc = subprocess.run([*ENVCHECK, "--env", "a", "--prefix", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "not both" in proc.stderr and proc.stdout == ""


@pytest.mark.fast
def test_only_runs_the_named_checks_and_what_they_need(tmp_path):
    """--only: the rows named (patterns too) and their prerequisites, in the table's order; a name of no row
    and --only with --fast are usage errors (exit 2) before anything runs; the report says what was asked."""
    ctx = Context(prefix=tmp_path / "gone", worker=True, fast=False, caller_env={})
    names = [spec.name for spec in select(TABLE, ["toolchain.sysroot"], ctx)]
    assert names == ["env.prefix", "variables.file", "variables.CC", "variables.CXX", "toolchain.sysroot"]
    names = [spec.name for spec in select(TABLE, ["gpu.*", "node.disk"], ctx)]
    assert names == ["env.prefix", "gpu.cuda", "gpu.driver", "gpu.nccl", "gpu.kind", "node.disk"]
    with pytest.raises(ValueError, match="'compile.nope' names no check"):
        select(TABLE, ["compile.nope"], ctx)
    gone = str(tmp_path / "gone")
    for bad, said in (
        (["--only", "compile.nope"], "compile.triton_build"),
        (["--only", "env.*", "--fast"], "not both"),
        (["--only", ","], "--only needs a check's name"),  # not the whole proof
    ):
        proc = subprocess.run([*ENVCHECK, "--prefix", gone, *bad], cwd=REPO, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        assert proc.returncode == 2 and said in proc.stderr and proc.stdout == "", proc.stderr
    proc = subprocess.run([*ENVCHECK, "--prefix", gone, "--only", "env.lock,node.*", "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    report = json.loads(proc.stdout)
    assert (
        proc.returncode == 1
        and report["only"] == ["env.lock", "node.*"]
        and report["failed"] == ["env.prefix"]
    )
    assert "--only env.lock,node.*" in proc.stderr


@pytest.mark.fast
def test_scrubbed_environment_drops_the_login_shell():
    login = {
        "PATH": "/opt/gcc/bin:/usr/bin",
        "CC": "/usr/bin/gcc",
        "CPATH": "/usr/include",
        "HOME": "/h",
        "USER": "u",
        "LANG": "en_US.UTF-8",
        "LD_LIBRARY_PATH": "/opt/x",
        "CONDA_PREFIX": "/envs/other",
    }
    assert scrubbed_environment(login) == {
        "PATH": "/usr/bin:/bin",
        "HOME": "/h",
        "USER": "u",
        "LANG": "en_US.UTF-8",
    }
    # the emulated aarch64 worker's qemu CPU (read only by qemu-user) reaches the job's processes
    emulated = scrubbed_environment({**login, "QEMU_CPU": "max,sve-default-vector-length=16"})
    assert emulated["QEMU_CPU"] == "max,sve-default-vector-length=16" and "CC" not in emulated


@pytest.mark.fast
def test_probes_get_private_empty_caches_and_remove_them(tmp_path):
    """Whatever cache dirs the job's environment names, a probe sees fresh empty ones (and a private
    TMPDIR, where Inductor keeps precompiled headers), gone after it ran."""
    warm = {name: tmp_path / name for name in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TMPDIR")}
    for path in warm.values():
        path.mkdir()
        (path / "cached-kernel.so").write_bytes(b"warm")
    script = (
        "import json, os\n"
        "names = ('TRITON_CACHE_DIR', 'TORCHINDUCTOR_CACHE_DIR', 'TMPDIR')\n"
        "print('ENVCHECK_RESULT=' + json.dumps({'ok': True, 'dirs': {n: os.environ[n] for n in names},\n"
        "      'contents': {n: os.listdir(os.environ[n]) for n in names}}))\n"
    )
    run = probes.run_probe(
        "caches", script, sys.executable, {**os.environ, **{k: str(v) for k, v in warm.items()}}
    )
    assert run.ok, run.stderr
    for name, path in run.result["dirs"].items():
        assert path != str(warm[name]) and run.result["contents"][name] == []
        assert not os.path.exists(path)


@pytest.mark.fast
def test_sigterm_ends_the_running_probe_at_once_and_leaves_nothing_behind(tmp_path):
    """A Slurm time limit or scancel while a compile row runs: bin/envcheck ends the probe's process group,
    removes its scratch dirs and exits 143 with one line (and the JSON error). Found by a review: it waited
    for the compile, then died leaving /tmp/envcheck-run-* (148 MB) and an orphaned probe compiling on."""
    from tests.support.channel import make_package

    channel = tmp_path / "channel"
    make_package(channel / "noarch", "hello", "1.0", {"share/hello.txt": b"hi\n"}, noarch="generic")
    index_channel(channel)
    spec = tmp_path / "project" / "environment.yml"
    spec.parent.mkdir()
    spec.write_text(f"name: stop-env\nchannels:\n  - {channel.as_uri()}\ndependencies:\n  - hello\n")
    env = {
        **os.environ,
        "CONDA_ENVS_PATH": str(tmp_path / "envs"),
        "LINGBOT_PKGS_DIR": str(tmp_path / "cache"),
    }
    for args in (["--relock"], []):
        subprocess.run([sys.executable, "-m", "provision.cli", "-f", str(spec), "-q", *args], env=env,
                       cwd=REPO, check=True, capture_output=True, timeout=300)  # fmt: skip
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    argv = [*ENVCHECK, "--env", "stop-env", "--only", "compile.inductor_cpp", "--json"]
    proc = subprocess.Popen(argv, env={**env, "TMPDIR": str(scratch)}, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        while proc.poll() is None and not list(scratch.glob("envcheck-inductor_cpp-*/envcheck_probe_*.py")):
            threading.Event().wait(0.05)  # the probe's script is written just before it starts
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "envcheck: stopped by SIGTERM before every check ran" in err
    assert json.loads(out)["ok"] is False and "stopped by SIGTERM" in json.loads(out)["error"]
    assert sorted(scratch.iterdir()) == []
    probe = subprocess.run(["pgrep", "-f", str(scratch)], capture_output=True, text=True)
    assert probe.stdout == "", probe.stdout  # no probe process left


@pytest.mark.fast
def test_cpu_flex_reuses_the_inductor_probes_scratch_which_is_gone_after_the_run(tmp_path, monkeypatch):
    """On CPU, compile.flex_attention's probe runs in compile.inductor_cpp's TORCHINDUCTOR_CACHE_DIR and
    TMPDIR (empty when the Inductor probe started; what it left there is there for FlexAttention), never in
    its TRITON_CACHE_DIR; another probe (compile.triton_build) keeps caches of its own; the shared dirs are
    gone when run_table returns. (Stand-in probe programs that report their dirs: the real compiles are
    test_worker_with_toolchain_passes_not_activated's.)"""
    script = (
        "import json, os, sys\n"
        "probe = os.path.basename(sys.argv[0])[len('envcheck_probe_'):-len('.py')]\n"
        "names = ('TRITON_CACHE_DIR', 'TORCHINDUCTOR_CACHE_DIR', 'TMPDIR')\n"
        "seen = {n: sorted(os.listdir(os.environ[n])) for n in names}\n"
        "for n in names:\n"
        "    open(os.path.join(os.environ[n], probe + '.built'), 'w').close()\n"
        "print('ENVCHECK_RESULT=' + json.dumps({'ok': True, 'stage': 'done', 'seen': seen,\n"
        "      'dirs': {n: os.environ[n] for n in names}}))\n"
    )
    monkeypatch.setattr(probes, "script", lambda name: script)
    # the job's own Inductor cache and TMPDIR, warm: never what a probe gets
    warm = {name: tmp_path / name for name in ("TORCHINDUCTOR_CACHE_DIR", "TMPDIR")}
    for path in warm.values():
        path.mkdir()
        (path / "cached-kernel.so").write_bytes(b"warm")
    caller = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **{k: str(v) for k, v in warm.items()}}
    ctx = Context(prefix=tmp_path, worker=False, fast=False, caller_env=caller, compile_as_caller=True)
    rows = _rows("compile.triton_build", "compile.inductor_cpp", "compile.flex_attention")
    checks = {c.name: c for c in run_table(ctx, rows)}
    assert all(c.status == PASS for c in checks.values()), checks
    details = {n: c.details for n, c in checks.items()}
    ind, flex, tri = (details[f"compile.{n}"] for n in ("inductor_cpp", "flex_attention", "triton_build"))
    assert ind["seen"] == {n: [] for n in ind["dirs"]}, ind  # empty when the run's first compile started
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TMPDIR"):
        assert ind["dirs"][name] != str(warm[name])
        assert flex["dirs"][name] == ind["dirs"][name] and flex["seen"][name] == ["inductor_cpp.built"]
        assert tri["dirs"][name] != ind["dirs"][name]
    triton = "TRITON_CACHE_DIR"
    assert flex["dirs"][triton] != ind["dirs"][triton] and not flex["seen"][triton]
    assert tri["seen"] == {n: [] for n in tri["dirs"]}, tri
    left = [d for details in (ind, flex, tri) for d in details["dirs"].values() if os.path.exists(d)]
    assert not left, left


# --- host with its system gcc: a login node ---------------------------------------------------------


@pytest.mark.heavy
def test_login_node_gcc_does_not_fool_worker_mode(envs, tmp_path):
    """The host has gcc and g++ in /usr/bin; the env has none. --worker must still FAIL, saying so.
    The same run reads a mount table (--mountinfo) that puts HOME, and so TRITON_CACHE_DIR, on NFS."""
    if not (shutil.which("gcc", path="/usr/bin:/bin") and shutil.which("g++", path="/usr/bin:/bin")):
        pytest.skip("needs a system gcc/g++ in /usr/bin (the login-node case)")
    home = tmp_path / "home"
    home.mkdir()
    table = tmp_path / "mountinfo"
    table.write_text(
        "20 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        f"40 20 0:50 /export/home {home} rw,relatime shared:9 - nfs4 filer:/export/home rw,vers=4.2\n"
    )
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8",
           "CC": "/usr/bin/gcc", "CXX": "/usr/bin/g++", "OMP_NUM_THREADS": "1"}  # fmt: skip
    proc = envcheck(None, "--prefix", str(envs.bare), "--worker", "--fast", "--json",
                    "--mountinfo", str(table), env=env)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert_report_shape(report)
    checks = by_name(report)
    for name in ("variables.CC", "variables.CXX", "compile.triton_build", "compile.inductor_cpp"):
        assert checks[name]["status"] == FAIL, checks[name]
    for name, real in (("compile.triton_build", "gcc"), ("compile.inductor_cpp", "g++")):
        message = checks[name]["message"]
        assert "system compiler" in message and "a worker has none" in message
        found = checks[name]["details"]["compiler_path"]
        assert found.startswith("/usr/") and real in os.path.basename(found), checks[name]["details"]
    assert "gcc_linux-64" in checks["compile.triton_build"]["fix"]
    assert "gxx_linux-64" in checks["compile.inductor_cpp"]["fix"]
    fs = checks["fs.triton_cache"]
    assert fs["status"] == WARN and fs["details"]["fstype"] == "nfs4"
    assert "triton#11512" in fs["message"] and "pytorch#173679" in fs["message"] and "node-local" in fs["fix"]
    assert checks["fs.inductor_cache"]["status"] == PASS  # /tmp stays on the local ext4
    summary = proc.stderr.strip().splitlines()[-1]
    assert (
        summary.startswith("envcheck: FAILED ")
        and "variables.CC" in summary
        and "compile.triton_build" in summary
    )


def _rows(*names: str) -> tuple:
    return tuple(spec for spec in TABLE if spec.name in names)


@pytest.mark.heavy
def test_login_node_gxx_does_not_fool_cpp_extension(envs, tmp_path):
    """compile.cpp_extension under --worker on a login node: CXX=/usr/bin/g++ and /usr/bin/ninja exist
    here, the env has neither; the check FAILs naming the system compiler instead of passing. (The env with
    the toolchain passes it with its own CXX and ninja over a login shell's CXX=/usr/bin/g++: the full
    --worker run, test_worker_with_toolchain_passes_not_activated, one cpp_extension build fewer here.)"""
    if not shutil.which("g++", path="/usr/bin:/bin"):
        pytest.skip("needs a system g++ in /usr/bin (the login-node case)")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8", "CXX": "/usr/bin/g++"}
    ctx = Context(prefix=envs.bare, worker=True, fast=False, caller_env=env)
    checks = {
        c.name: c for c in run_table(ctx, _rows("variables.file", "variables.CXX", "compile.cpp_extension"))
    }
    cpp = checks["compile.cpp_extension"]  # the worker's scrubbed PATH still finds /usr/bin/c++: never a PASS
    assert cpp.status == FAIL and "which is not in the env" in cpp.message, cpp
    assert cpp.details["compiler_path"].startswith("/usr/") and "gxx_linux-64" in cpp.fix


@pytest.mark.heavy
def test_a_skipped_check_names_the_prerequisite_that_failed(tmp_path):
    prefix = tmp_path / "not-provisioned"
    prefix.mkdir()
    (prefix / "something").write_text("x")  # a directory bin/provision did not make (e.g. a venv)
    ctx = Context(prefix=prefix, worker=True, fast=False, caller_env=dict(os.environ))
    rows = _rows(
        "variables.file", "variables.CC", "variables.CXX", "toolchain.sysroot", "compile.cpp_extension"
    )
    checks = {c.name: c for c in run_table(ctx, rows)}
    assert checks["variables.file"].status == FAIL
    assert (
        "bin/provision lingbot-b200" in checks["variables.file"].fix
        and ".venv" not in checks["variables.file"].fix
    )
    for name in ("variables.CC", "variables.CXX", "toolchain.sysroot", "compile.cpp_extension"):
        assert checks[name].status == SKIP and "see variables.file" in checks[name].message, checks[name]


@pytest.mark.fast
def test_slow_checks_run_at_once_and_wait_only_for_their_prerequisites(tmp_path):
    """Two slow rows meet at a barrier (they can only pass it together), a third needs the first to PASS
    and sees its result, a plain row after them runs meanwhile, and the report keeps the table's order."""
    seen: dict[str, str] = {}

    def meet(both: threading.Barrier):
        def run(_ctx: Context) -> Outcome:
            both.wait()  # BrokenBarrierError (a FAIL) unless the other row runs at the same time
            return Outcome(PASS, "met the other")

        return run

    def after(c: Context) -> Outcome:
        first = c.result("slow.a")
        seen["slow.a"] = first.status if first is not None else "missing"
        return Outcome(PASS, "ran after slow.a")

    def rows(both: threading.Barrier, slow: bool) -> tuple[CheckSpec, ...]:
        mark = "x" if slow else ""
        return (
            CheckSpec("slow.a", meet(both), slow=mark),
            CheckSpec("slow.needs_a", after, needs_pass=("slow.a",), slow=mark),
            CheckSpec("plain", lambda c: Outcome(PASS, "inline")),
            CheckSpec("slow.b", meet(both), slow=mark),
        )

    ctx = Context(prefix=tmp_path, worker=False, fast=False, caller_env={})
    checks = run_table(ctx, rows(threading.Barrier(2, timeout=60), slow=True))
    assert [c.name for c in checks] == ["slow.a", "slow.needs_a", "plain", "slow.b"]
    assert all(c.status == PASS for c in checks), checks
    assert seen == {"slow.a": PASS} and not ctx.running
    # the same rows, none slow, run one after another: the barrier breaks, so the check above is real
    ctx = Context(prefix=tmp_path, worker=False, fast=False, caller_env={})
    serial = {c.name: c.status for c in run_table(ctx, rows(threading.Barrier(2, timeout=1), slow=False))}
    assert serial["slow.a"] == FAIL and serial["slow.b"] == FAIL, serial


# --- inside the worker simulation ---------------------------------------------------------------------


TRITON_CACHE_PROBE = r"""
import sys
from triton.runtime import build
src = '#include <Python.h>\n' \
      'static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "warm_probe", NULL, -1, NULL};\n' \
      'PyMODINIT_FUNC PyInit_warm_probe(void) { return PyModule_Create(&m); }\n'
try:
    build.compile_module_from_src(src, "warm_probe")
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
    sys.exit(1)
print("loaded")
"""


def warm_the_bare_envs_triton_cache(worker, envs, worker_env, home: Path, tmp_path: Path):
    """The real Triton cache dir of the bare env's jobs (HOME=home), filled by a passing run of the env with
    the toolchain; proven to mask the missing compiler for anything that reads it. Returns the dir and its
    files."""
    base = scrubbed_environment({**worker_env, "HOME": str(home)})
    bare_job, tool_job = job_environment(envs.bare, base), job_environment(envs.tool, base)
    cache = Path(bare_job["TRITON_CACHE_DIR"])  # the real cache dir the bare env's jobs use
    tool_job["TRITON_CACHE_DIR"] = str(cache)
    script = tmp_path / "warm_probe.py"
    script.write_text(TRITON_CACHE_PROBE)

    # A passing run (the env with the toolchain) leaves compiled modules in that cache ...
    warmed = worker.run([sys.executable, str(script)], env=tool_job, cwd=tmp_path, timeout=120)
    assert warmed.stdout.strip() == "loaded", warmed.stdout + warmed.stderr
    cached = sorted(p.relative_to(cache) for p in cache.rglob("*") if p.is_file())
    assert any(p.name.endswith(".so") for p in cached)
    # ... and they really do mask the missing compiler for anything that reads the cache:
    masked = worker.run([sys.executable, str(script)], env=bare_job, cwd=tmp_path, timeout=120)
    assert masked.stdout.strip() == "loaded", masked.stdout + masked.stderr
    cold_env = {**bare_job, "TRITON_CACHE_DIR": str(tmp_path / "cold")}
    cold = worker.run([sys.executable, str(script)], env=cold_env,
                      cwd=tmp_path, timeout=120)  # fmt: skip
    assert "Failed to find C compiler" in cold.stdout
    return cache, cached


@pytest.mark.heavy
@pytest.mark.worker
def test_worker_without_toolchain_fails_with_the_real_errors(worker, envs, worker_env, tmp_path):
    """The bare env's full --worker run FAILs each compile row with the error a job would hit, and the fix.
    It runs over a warm Triton cache (warm_the_bare_envs_triton_cache): the cache masks the missing compiler
    for real, yet envcheck compiles in throwaway caches, FAILs, and leaves the real cache as it was."""
    home = tmp_path / "home"
    home.mkdir()
    cache, cached = warm_the_bare_envs_triton_cache(worker, envs, worker_env, home, tmp_path)
    out = tmp_path / "report.json"
    proc = envcheck(worker, "--prefix", str(envs.bare), "--worker", "--json-file", str(out),
                    env={**worker_env, "HOME": str(home)})  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert_report_shape(report)
    checks = by_name(report)
    assert {"variables.CC", "variables.CXX", "compile.triton_build", "compile.inductor_cpp"} <= set(
        report["failed"]
    )
    assert "CC is not set" in checks["variables.CC"]["message"]
    assert "CXX is not set" in checks["variables.CXX"]["message"]
    for name, package in (
        ("variables.CC", "gcc_linux-64"),
        ("variables.CXX", "gxx_linux-64"),
        ("compile.triton_build", "gcc_linux-64"),
        ("compile.inductor_cpp", "gxx_linux-64"),
    ):
        assert f"the env lacks {package}: add it to environment.yml, relock" in checks[name]["fix"], name
    # The errors a job would hit, verbatim.
    assert (
        "RuntimeError: Failed to find C compiler. Please specify via CC environment variable"
        in checks["compile.triton_build"]["message"]
    )
    assert (
        "InvalidCxxCompiler: No working C++ compiler found in torch._inductor.config.cpp.cxx: (None, 'g++')"
        in checks["compile.inductor_cpp"]["message"]
    )
    assert checks["compile.flex_attention"]["status"] == SKIP  # same missing compiler, named
    cpp = checks["compile.cpp_extension"]  # torch.utils.cpp_extension's JIT (gymtorch) has no compiler either
    assert cpp["status"] == FAIL and "the env lacks gxx_linux-64" in cpp["fix"], cpp
    assert checks["node.glibc"]["status"] == FAIL and "sysroot_linux-64" in checks["node.glibc"]["fix"]
    ssl = checks["toolchain.openssl"]  # the worker image has no openssl; Inductor's PCH runs `openssl sha512`
    assert ssl["status"] == FAIL and "no openssl on the job's PATH" in ssl["message"], ssl
    assert "the env lacks openssl: add it to environment.yml, relock" in ssl["fix"], ssl
    for name in GPU_CHECKS:  # CPU-only node: SKIP with the reason, never PASS
        assert checks[name]["status"] == SKIP and "CPU-only node" in checks[name]["message"]
    summary = proc.stdout.strip().splitlines()[-1]
    assert (
        summary.startswith("envcheck: FAILED variables.CC, variables.CXX, ")
        and "compile.inductor_cpp" in summary
    )
    assert "envcheck: compile.inductor_cpp: FAIL in" in proc.stderr  # progress goes to stderr
    # The warm cache did not turn the missing compiler into a PASS (the FAIL above), and it was the one
    # this run looked at; envcheck compiled in throwaway caches: the real one is as the passing run left it.
    assert checks["cache.triton_dir"]["message"].startswith(f"{cache} exists, writable")
    assert sorted(p.relative_to(cache) for p in cache.rglob("*") if p.is_file()) == cached


@pytest.mark.heavy
@pytest.mark.worker
@pytest.mark.slow
def test_worker_with_toolchain_passes_not_activated(worker, envs, worker_env, tmp_path):
    """The full --worker run: a non-activated job with a scrubbed environment on a compiler-less node,
    submitted from a login shell whose CC/CXX name the login node's compilers (the job never sees them)."""
    out = tmp_path / "report.json"
    login = {**worker_env, "CC": "/usr/bin/gcc", "CXX": "/usr/bin/g++"}
    proc = envcheck(worker, "--prefix", str(envs.tool), "--worker", "--json-file", str(out), env=login)
    report = json.loads(out.read_text())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_report_shape(report)
    checks = by_name(report)
    assert report["ok"] and report["worker"] and not report["fast"]
    for name in (
        "variables.CC",
        "variables.CXX",
        "toolchain.sysroot",
        "compile.triton_build",
        "compile.inductor_cpp",
        "compile.flex_attention",
        "compile.cpp_extension",
        "env.lock",
        "node.glibc",
    ):
        assert checks[name]["status"] == PASS, checks[name]
    for name in (
        "compile.triton_build",
        "compile.inductor_cpp",
        "compile.flex_attention",
        "compile.cpp_extension",
    ):
        assert inside(checks[name]["details"]["compiler_path"], envs.tool), checks[name]["details"]
    cpp = checks["compile.cpp_extension"]  # load_inline: torch headers, the env's CXX and ninja, called
    assert cpp["status"] == PASS and cpp["details"]["value"] == [1.0, 3.0, 5.0, 7.0], cpp
    assert inside(cpp["details"]["ninja_path"], envs.tool), cpp["details"]
    assert checks["compile.inductor_cpp"]["details"]["kernels_with_openmp"] >= 1
    assert checks["compile.flex_attention"]["details"]["forward_max_abs_error"] < 1e-4
    assert all(inside(p, envs.tool) for p in checks["toolchain.sysroot"]["details"]["files"].values())
    ssl = checks["toolchain.openssl"]  # found on the scrubbed PATH, in the env (the system's is hidden)
    assert ssl["status"] == PASS and inside(ssl["details"]["openssl"], envs.tool), ssl
    for name in GPU_CHECKS:
        assert checks[name]["status"] == SKIP
    assert proc.stdout.strip().splitlines()[-1].startswith("envcheck: OK: lingbot-test-tool")


@pytest.mark.heavy
@pytest.mark.worker
def test_worker_with_toolchain_passes_activated(worker, envs, worker_env, tmp_path):
    """Activated the way conda does it (CONDA_PREFIX, PATH, every activate.d script sourced), over a
    login shell that had CC=/usr/bin/gcc: the env's compilers win and the preflight subset passes."""
    out = tmp_path / "report.json"
    script = (
        f'export CONDA_PREFIX="{envs.tool}" PATH="{envs.tool}/bin:$PATH" CC=/usr/bin/gcc CXX=/usr/bin/g++\n'
        f'for hook in "$CONDA_PREFIX"/etc/conda/activate.d/*.sh; do . "$hook"; done\n'
        f'exec "$@"\n'
    )
    argv = ["/bin/sh", "-c", script, "activate", *ENVCHECK, "--prefix", str(envs.tool), "--fast",
            "--json-file", str(out)]  # fmt: skip
    proc = worker.run(argv, env=worker_env, cwd=REPO, timeout=900)
    report = json.loads(out.read_text())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = by_name(report)
    assert "activated shell" in checks["variables.file"]["message"]
    assert checks["variables.CC"]["message"].startswith(f"CC={envs.tool}/bin/x86_64-conda-linux-gnu-cc")
    for name in ("compile.triton_build", "compile.inductor_cpp"):
        assert checks[name]["status"] == PASS and inside(checks[name]["details"]["compiler_path"], envs.tool)
    assert report["fast"] and "compile.flex_attention" not in checks and "gpu.cuda" not in checks


@pytest.mark.heavy
@pytest.mark.worker
def test_worker_without_the_envs_openssl_fails_inductors_row_naming_it(worker, envs, worker_env, tmp_path):
    """Inductor's CPU precompiled header runs `openssl sha512` (torch/_inductor/codecache.py): on a worker
    image without one, an env that lacks it fails both its row and Inductor's C++ compile, each naming the
    package (was a FileNotFoundError traceback). The env's own openssl is hidden (tests/support/hidden.py),
    the system's already is (the worker simulation); the other compile rows do not read it (`--only`). This
    was the emulated aarch64 lane's openssl run (145 s under qemu), which now asserts only the row there."""
    out = tmp_path / "report.json"
    argv = [*ENVCHECK, "--prefix", str(envs.tool), "--worker", "--json-file", str(out),
            "--only", "toolchain.openssl,compile.inductor_cpp"]  # fmt: skip
    proc = worker.run(without(envs.tool, ["bin/openssl"], argv, tmp_path / "overlay"), env=worker_env,
                      cwd=REPO, timeout=900)  # fmt: skip
    assert out.is_file(), proc.stdout + proc.stderr
    checks = by_name(json.loads(out.read_text()))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    ssl, inductor = checks["toolchain.openssl"], checks["compile.inductor_cpp"]
    broken = "openssl is installed but broken or incomplete: provision the env"  # its record is there
    assert ssl["status"] == FAIL and broken in ssl["fix"], ssl
    assert inductor["status"] == FAIL, inductor
    assert "no `openssl` command (Inductor's precompiled header runs `openssl sha512`)" in inductor["message"]
    assert broken in inductor["fix"], inductor
    assert (envs.tool / "bin" / "openssl").is_file()  # the env itself is as it was
