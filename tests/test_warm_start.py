"""Requeue warm start: the persistent compile caches (seeding, atomic no-overwrite write-back, concurrent
writers) and the preflight's recorded compile-check pass (reused on the same node, boot and env only).
The compiled training path (train.compile) is tested in tests/test_compile_option.py."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path

import pytest

import provision.check
from provision.check import PASS, WARN, Check, Report
from trainer.launcher import compile_cache, preflight
from trainer.launcher.compile_cache import (
    PERSISTENT_PREFIX,
    localise_compile_caches,
    persistent_dirs,
    publish,
    write_back_compile_caches,
)
from trainer.launcher.envchoice import EnvChoice
from trainer.launcher.preflight import REUSABLE_CHECKS, env_checks, record_path

pytestmark = pytest.mark.fast


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def make(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


# --- persistent caches ----------------------------------------------------------------------------


def test_persistent_caches_are_keyed_by_env_and_gpu_kind(tmp_path):
    env = {"HOME": str(tmp_path)}
    dirs = persistent_dirs(env, "lingbot-b200", "cpu")
    assert dirs["TRITON_CACHE_DIR"] == tmp_path / ".triton" / "cache_lingbot-b200_cpu"
    assert (
        dirs["TORCHINDUCTOR_CACHE_DIR"] == tmp_path / ".cache" / "lingbot" / "torchinductor_lingbot-b200_cpu"
    )
    # the env's hooks set the GPU kind and TRITON_CACHE_DIR: both win over the detected defaults
    env = {"HOME": str(tmp_path), "LINGBOT_GPU_KIND": "b200", "TRITON_CACHE_DIR": str(tmp_path / "t")}
    dirs = persistent_dirs(env, "lingbot-b200", "cpu")
    assert dirs["TRITON_CACHE_DIR"] == tmp_path / "t"
    assert dirs["TORCHINDUCTOR_CACHE_DIR"].name == "torchinductor_lingbot-b200_b200"
    assert persistent_dirs(env, "other", "cpu")["TORCHINDUCTOR_CACHE_DIR"] != dirs["TORCHINDUCTOR_CACHE_DIR"]


def test_an_attempt_is_seeded_from_the_persistent_cache_and_writes_new_entries_back(tmp_path):
    shared = tmp_path / "shared"
    make(shared, {"fxgraph/ab/key1/entry": "old", "aotautograd/k/entry": "old", "locks/x.lock": ""})
    env = {"HOME": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(shared)}
    notes = localise_compile_caches(env, tmp_path / "scratch", "job7", "lingbot-b200", "cpu")
    local = Path(env["TORCHINDUCTOR_CACHE_DIR"])
    assert local != shared and local.is_relative_to(tmp_path / "scratch")
    assert env[PERSISTENT_PREFIX + "TORCHINDUCTOR_CACHE_DIR"] == str(shared)
    assert tree(local) == {"fxgraph/ab/key1/entry": "old", "aotautograd/k/entry": "old"}  # no lock files
    assert any("seeded from" in n and "2 files" in n for n in notes)
    # this attempt compiles: new entries in new and in existing directories, an existing one "changed"
    make(local, {"fxgraph/ab/key2/entry": "new", "fxgraph/ab/key1/extra": "new", "cpp/m.so": "new"})
    (local / "fxgraph/ab/key1/entry").write_text("changed")
    (local / "fxgraph/.123.456.tmp").write_text("half")  # a writer's temporary file
    notes = write_back_compile_caches(env)
    assert tree(shared) == {
        "fxgraph/ab/key1/entry": "old",  # never overwritten
        "fxgraph/ab/key1/extra": "new",
        "fxgraph/ab/key2/entry": "new",
        "aotautograd/k/entry": "old",
        "cpp/m.so": "new",
        "locks/x.lock": "",
    }
    assert any("3 new cache files" in n for n in notes)
    assert not local.exists() and not local.parent.exists()  # the node-local copy is removed
    assert not [p for p in shared.rglob("*") if "lingbot-tmp" in p.name]


def test_a_first_attempt_creates_the_persistent_cache(tmp_path):
    env = {"HOME": str(tmp_path)}
    localise_compile_caches(env, tmp_path / "scratch", "j", "tool-env", "cpu")
    make(Path(env["TRITON_CACHE_DIR"]), {"abc/kernel.so": "k", "abc/__grp__kernel.json": "{}"})
    make(Path(env["TRITON_CACHE_DIR"]), {"tmp.pid_123_456/half.so": "x"})  # a killed writer's staging dir
    write_back_compile_caches(env)
    assert tree(tmp_path / ".triton" / "cache_tool-env_cpu") == {
        "abc/kernel.so": "k",
        "abc/__grp__kernel.json": "{}",
    }


def test_inductor_precompiled_headers_persist_through_the_ranks_tmpdir(tmp_path):
    """Inductor keeps precompiled headers under $TMPDIR whatever its cache dir says: the ranks get a
    node-local TMPDIR seeded from the persistent copy beside the Inductor cache, written back at exit."""
    inductor = tmp_path / "ind"
    persistent_pch = tmp_path / "ind_precompiled_headers"
    make(persistent_pch, {"abc.h": "#include <x>", "abc.h.gch": "pch", "locks/abc.lock": ""})
    env = {"HOME": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(inductor), "TMPDIR": "/launcher/tmp"}
    localise_compile_caches(env, tmp_path / "scratch", "j", "tool-env", "cpu")
    ranks_tmp = Path(env["TMPDIR"])
    assert ranks_tmp.is_relative_to(tmp_path / "scratch")
    local_pch = compile_cache.inductor_header_dir(ranks_tmp)
    assert tree(local_pch) == {"abc.h": "#include <x>", "abc.h.gch": "pch"}
    make(local_pch, {"def.h.gch": "new pch"})
    write_back_compile_caches(env)
    assert tree(persistent_pch)["def.h.gch"] == "new pch"
    assert not ranks_tmp.exists()  # the ranks' TMPDIR goes with the local copies


def test_headers_inside_an_inductor_cache_dir_are_not_copied_for_the_ranks(tmp_path):
    """TORCHINDUCTOR_CACHE_DIR naming Inductor's default dir (torch exports it after a compile) holds
    precompiled_headers/, which Inductor reads only from $TMPDIR: the ranks' copy leaves it out (155 MB a
    header with torch 2.13), keeps every kernel entry, and a deeper dir of that name is an entry like any."""
    inductor = tmp_path / "torchinductor_root"
    make(inductor, {"precompiled_headers/abc.h.gch": "pch" * 1000, "fxgraph/x/entry": "graph",
                    "ab/precompiled_headers/k.so": "kernel"})  # fmt: skip
    env = {"HOME": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(inductor)}
    notes = localise_compile_caches(env, tmp_path / "scratch", "j", "tool-env", "cpu")
    assert tree(Path(env["TORCHINDUCTOR_CACHE_DIR"])) == {
        "fxgraph/x/entry": "graph",
        "ab/precompiled_headers/k.so": "kernel",
    }
    assert any("TORCHINDUCTOR_CACHE_DIR" in n and ": 2 files" in n for n in notes), notes
    write_back_compile_caches(env)
    assert tree(inductor)["precompiled_headers/abc.h.gch"] == "pch" * 1000  # the original is untouched


def _publisher(src: str, dest: str, barrier, results) -> None:
    barrier.wait()  # every writer starts publishing at the same moment
    results.put(publish(Path(src), Path(dest)).files)


def test_concurrent_writers_never_leave_a_mixed_or_partial_entry(tmp_path):
    """Eight processes publish the same entry names with their own contents at the same moment: every
    directory is wholly one writer's (it appeared by one rename), every file is whole, no temp is left."""
    writers = 8
    names = [f"kern{i}" for i in range(6)]
    for w in range(writers):
        make(
            tmp_path / f"src{w}",
            {f"{n}/{part}": f"{w}:{n}:{part}:" + "x" * 20000 for n in names for part in ("a.so", "b.json")},
        )
        make(tmp_path / f"src{w}", {"shared_dir/file": f"{w}:" + "y" * 20000})
    dest = tmp_path / "dest"
    make(dest, {"shared_dir/.keep": ""})  # an existing directory: files are published one by one
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(writers), ctx.Queue()
    procs = [
        ctx.Process(target=_publisher, args=(str(tmp_path / f"src{w}"), str(dest), barrier, results))
        for w in range(writers)
    ]
    for proc in procs:
        proc.start()
    added = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    assert sum(added) == 2 * len(names) + 1  # each entry published exactly once
    for n in names:
        a, b = (dest / n / "a.so").read_text(), (dest / n / "b.json").read_text()
        assert a.split(":")[0] == b.split(":")[0]  # one writer's directory, never a mix
        assert a.endswith("x" * 20000) and b.endswith("x" * 20000)  # whole files
    assert (dest / "shared_dir" / "file").read_text().endswith("y" * 20000)
    assert not [p for p in dest.rglob("*") if "lingbot-tmp" in p.name]


def test_without_hard_links_a_file_is_renamed_into_place_but_never_over_an_entry(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise OSError(1, "Operation not permitted")  # EPERM: a filesystem without hard links

    monkeypatch.setattr(compile_cache.os, "link", no_links)
    make(tmp_path / "src", {"d/new": "new", "d/old": "mine"})
    make(tmp_path / "dest", {"d/old": "theirs"})
    assert publish(tmp_path / "src", tmp_path / "dest").files == 1
    assert tree(tmp_path / "dest") == {"d/new": "new", "d/old": "theirs"}


# --- the preflight's recorded pass ----------------------------------------------------------------


@pytest.fixture
def fake_envcheck(monkeypatch):
    """run_checks replaced by a recorder: which rows each call ran; compile checks pass (one WARNs)."""
    calls: list[list[str]] = []

    def run_checks(prefix, *, table=provision.check.TABLE, **kw):
        names = [spec.name for spec in table]
        calls.append(names)
        checks = [
            Check("compile.triton_build", PASS, 1.0, "ok"),
            Check("compile.inductor_cpp", WARN, 20.0, "compiled with a system compiler"),
            Check("node.disk", PASS, 0.0, "room"),
        ]
        report = Report("p", "e", False, True, "n", "now")
        report.checks = [c for c in checks if c.name in names]
        return report

    monkeypatch.setattr(provision.check, "run_checks", run_checks)
    monkeypatch.setattr(preflight, "boot_id", lambda: "boot-1")
    return calls


def tool_choice(tmp_path: Path) -> EnvChoice:
    return EnvChoice(tmp_path / "venv", tmp_path / "venv" / "bin" / "python", provisioned=False)


def test_a_requeue_on_the_same_node_and_env_reuses_the_compile_checks(tmp_path, fake_envcheck):
    choice, env, run_dir = tool_choice(tmp_path), {"CC": "gcc", "PATH": "/usr/bin"}, tmp_path / "run"
    env_checks(choice, env, run_dir)
    assert set(REUSABLE_CHECKS) <= set(fake_envcheck[-1])  # the first attempt ran them
    record = json.loads(record_path(run_dir).read_text())
    assert {c["name"] for c in record["passed"]} == set(REUSABLE_CHECKS)
    notes = env_checks(choice, env, run_dir)
    assert not set(REUSABLE_CHECKS) & set(fake_envcheck[-1])  # not rerun
    assert "node.disk" in fake_envcheck[-1]  # the cheap checks still run
    assert any("not rerun" in n for n in notes)
    assert any(n.startswith("envcheck WARN compile.inductor_cpp") for n in notes)  # its caveat repeated


@pytest.mark.parametrize(
    "change",
    ["reboot", "other node", "changed variable", "reprovisioned env", "changed check code"],
)
def test_another_node_boot_or_env_reruns_the_compile_checks(tmp_path, fake_envcheck, monkeypatch, change):
    choice, env, run_dir = tool_choice(tmp_path), {"CC": "gcc", "PATH": "/usr/bin"}, tmp_path / "run"
    env_checks(choice, env, run_dir)
    if change == "reboot":
        monkeypatch.setattr(preflight, "boot_id", lambda: "boot-2")
    elif change == "other node":
        real = record_path(run_dir)
        monkeypatch.setattr(preflight.socket, "gethostname", lambda: "node-b")
        assert record_path(run_dir) != real
    elif change == "changed variable":
        env = {**env, "CC": "/opt/other/gcc"}
    elif change == "reprovisioned env":
        (choice.prefix).mkdir(parents=True)
        (choice.prefix / ".lingbot-ready").write_text("a new pyproject hash\n")
    else:
        monkeypatch.setattr(preflight, "_code_sha", lambda: "different")
    env_checks(choice, env, run_dir)
    assert set(REUSABLE_CHECKS) <= set(fake_envcheck[-1])


def test_no_boot_id_never_reuses(tmp_path, fake_envcheck, monkeypatch):
    monkeypatch.setattr(preflight, "boot_id", lambda: "")
    choice, run_dir = tool_choice(tmp_path), tmp_path / "run"
    env_checks(choice, {}, run_dir)
    env_checks(choice, {}, run_dir)
    assert set(REUSABLE_CHECKS) <= set(fake_envcheck[-1])


def test_a_failed_preflight_records_nothing(tmp_path, monkeypatch):
    def failing(prefix, **kw):
        report = Report("p", "e", False, True, "n", "now")
        report.checks = [
            Check("compile.inductor_cpp", PASS, 1.0, "ok"),
            Check("node.disk", "FAIL", 0, "full"),
        ]
        return report

    monkeypatch.setattr(provision.check, "run_checks", failing)
    with pytest.raises(preflight.PreflightError, match="node.disk"):
        env_checks(tool_choice(tmp_path), {}, tmp_path / "run")
    assert not record_path(tmp_path / "run").exists()


def test_the_real_boot_id_is_read(tmp_path):
    if not os.path.exists("/proc/sys/kernel/random/boot_id"):
        pytest.skip("no /proc/sys/kernel/random/boot_id on this system")
    assert len(preflight.boot_id()) == 36
    assert preflight.boot_id(tmp_path / "missing") == ""
