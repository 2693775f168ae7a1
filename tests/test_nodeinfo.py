"""provision.nodeinfo: filesystem detection from a mount table the test controls, glibc, GPU kinds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from provision import nodeinfo
from provision.check import PASS, WARN, cache_filesystem_verdict


def mountinfo_line(mount_id: int, mount_point: str, fstype: str, source: str) -> str:
    escaped = mount_point.replace("\\", "\\134").replace(" ", "\\040")
    return f"{mount_id} 1 0:{mount_id} / {escaped} rw,relatime shared:{mount_id} - {fstype} {source} rw"


def write_table(path: Path, mounts: list[tuple[str, str, str]]) -> Path:
    lines = [
        mountinfo_line(20 + i, point, fstype, source) for i, (point, fstype, source) in enumerate(mounts)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.fast
def test_longest_mount_point_wins_and_later_mounts_stack(tmp_path):
    (tmp_path / "home" / "alice" / ".triton").mkdir(parents=True)
    table = write_table(tmp_path / "mountinfo", [
        ("/", "ext4", "/dev/vda"),
        (str(tmp_path / "home"), "nfs4", "filer:/home"),
        (str(tmp_path / "home"), "lustre", "mds@tcp:/fs"),  # stacked on the nfs mount: it is what is seen
        (str(tmp_path / "ho"), "tmpfs", "tmpfs"),  # a prefix of the path's string, not of its components
    ])  # fmt: skip
    assert nodeinfo.filesystem_type(tmp_path / "home" / "alice" / ".triton", table) == "lustre"
    assert nodeinfo.filesystem_type(tmp_path / "homeless", table) == "ext4"
    # A cache dir that does not exist yet lives where its nearest existing parent does.
    assert nodeinfo.filesystem_type(tmp_path / "home" / "alice" / "not" / "yet", table) == "lustre"


@pytest.mark.fast
def test_escaped_mount_points_and_symlinks(tmp_path):
    spaced = tmp_path / "with space"
    spaced.mkdir()
    link = tmp_path / "link"
    link.symlink_to(spaced)
    table = write_table(
        tmp_path / "mountinfo", [("/", "ext4", "/dev/vda"), (str(spaced), "cifs", "//srv/share")]
    )
    assert nodeinfo.read_mounts(table)[1].mount_point == str(spaced)
    assert nodeinfo.filesystem_type(link / "cache", table) == "cifs"  # the link's target decides


@pytest.mark.fast
def test_malformed_table_names_the_file_and_line(tmp_path):
    table = tmp_path / "mountinfo"
    table.write_text(mountinfo_line(1, "/", "ext4", "/dev/vda") + "\nnot a mount line\n")
    with pytest.raises(ValueError, match=rf"{table}:2: not a mountinfo line"):
        nodeinfo.read_mounts(table)


@pytest.mark.fast
@pytest.mark.parametrize(
    "fstype, network",
    [("nfs", True), ("nfs4", True), ("lustre", True), ("gpfs", True), ("beegfs", True), ("cifs", True),
     ("smb3", True), ("ceph", True), ("glusterfs", True), ("fuse.sshfs", True), ("fuse.gcsfuse", True),
     ("ext4", False), ("xfs", False), ("tmpfs", False), ("overlay", False), ("fuseblk", False)],
)  # fmt: skip
def test_network_filesystem_types(fstype, network):
    assert nodeinfo.is_network_fs(fstype) is network


@pytest.mark.heavy
def test_real_tmpfs_and_bind_mount_reported_as_network_are_flagged(tmp_path):
    """A real tmpfs and a bind mount of it, made in a private mount namespace; their table is then edited
    to say nfs4 / lustre, as a cluster's home and scratch would show, and the verdict follows the table."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to make real mounts in a private namespace")
    tmpfs_dir, bind_dir = tmp_path / "tmpfs-home", tmp_path / "bind-scratch"
    tmpfs_dir.mkdir()
    bind_dir.mkdir()
    script = (
        f"mount -t tmpfs envcheck-test {tmpfs_dir} && mount --bind {tmpfs_dir} {bind_dir} && "
        "cat /proc/self/mountinfo"
    )
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    if proc.returncode != 0:
        pytest.skip(f"mounts not permitted here: {proc.stderr.strip()}")
    real_table = tmp_path / "mountinfo-real"
    real_table.write_text(proc.stdout)
    # The namespace is gone, but its table says what the paths were: both tmpfs.
    assert nodeinfo.filesystem_type(tmpfs_dir / "triton", real_table) == "tmpfs"
    assert nodeinfo.mount_of(bind_dir, real_table).mount_point == str(bind_dir)
    assert cache_filesystem_verdict("TRITON_CACHE_DIR", str(tmpfs_dir), real_table)[0] == PASS

    edited = []
    for line in proc.stdout.splitlines():
        fields = line.split(" ")
        sep = fields.index("-", 6)
        if fields[4] == str(tmpfs_dir):
            fields[sep + 1 : sep + 3] = ["nfs4", "filer:/export/home"]
        elif fields[4] == str(bind_dir):
            fields[sep + 1 : sep + 3] = ["lustre", "mds@o2ib:/scratch"]
        edited.append(" ".join(fields))
    table = tmp_path / "mountinfo-edited"
    table.write_text("\n".join(edited) + "\n")

    for path, fstype in ((tmpfs_dir / "triton" / "cache_b200", "nfs4"), (bind_dir / "inductor", "lustre")):
        status, message, fix, details = cache_filesystem_verdict("TRITON_CACHE_DIR", str(path), table)
        assert (status, details["fstype"]) == (WARN, fstype)
        assert "triton#11512" in message and "pytorch#173679" in message
        assert "node-local" in fix and "bin/train" in fix
    assert cache_filesystem_verdict("cache", str(tmp_path), table)[0] == PASS  # its parent stays local


@pytest.mark.fast
def test_glibc_versions(tmp_path):
    node = nodeinfo.node_glibc()
    assert node is not None and nodeinfo.parse_version(node) >= (2, 17)
    (tmp_path / "conda-meta").mkdir()
    assert nodeinfo.sysroot_glibc(tmp_path) is None
    record = {"name": "sysroot_linux-64", "version": "2.17", "build": "h0157908_18"}
    (tmp_path / "conda-meta" / "sysroot_linux-64-2.17-h0157908_18.json").write_text(json.dumps(record))
    assert nodeinfo.sysroot_glibc(tmp_path) == "2.17"
    assert nodeinfo.parse_version("2.35") > nodeinfo.parse_version("2.17")


@pytest.mark.fast
@pytest.mark.parametrize(
    "text, kind",
    [("NVIDIA B200", "b200"), ("NVIDIA H200 NVL", "h200"), ("lingbot-b200", "b200"),
     ("NVIDIA GB200", "gb200"),
     ("/home/u/.triton/cache_lingbot-h200_h200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"), ("cpu", None),
     ("b2000", None)],
)  # fmt: skip
def test_gpu_kind(text, kind):
    assert nodeinfo.gpu_kind(text) == kind
