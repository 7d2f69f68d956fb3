"""session.files against a real daemon, through the sync and the async client: bytes read and
written, trees uploaded and downloaded back unchanged (modes, symlinks, a file bigger than one
message), cp's rule, overwrite, what a download skips, and the sandbox's rules holding."""

from __future__ import annotations

import os
import time

import pytest
from conftest import session_env
from corral_client import AlreadyExists, CorralError, NotFound, TransferChanged, Unimplemented
from files_helpers import Api, make_tree, make_writable, snapshot

MIB = 1024 * 1024


@pytest.fixture
def rw(client, workspace):
    with client.open_session(workspace, "workspace-write", env=session_env(workspace)) as s:
        try:
            s.files.read("probe")
        except Unimplemented:
            pytest.skip("this daemon does not serve corral.v1.Files (built before the i12-files merge)")
        except NotFound:
            pass
        yield s


@pytest.fixture(params=["sync", "async"])
def call(request, rw, daemon):
    return Api(request.param, daemon.target, rw.id)


def test_bytes_read_and_written(call, workspace):
    blob = bytes(range(256)) * 1000 + b"\x00end"
    written = call("write", "dir/blob.bin", blob, mode=0o640, create_parents=True)
    assert (written.path, written.size) == (f"{workspace}/dir/blob.bin", len(blob))
    assert (workspace / "dir" / "blob.bin").read_bytes() == blob
    assert oct(os.stat(workspace / "dir" / "blob.bin").st_mode & 0o777) == oct(0o640)
    assert call("read", "dir/blob.bin") == blob
    # Replacing keeps the mode unless told; overwrite=False refuses.
    call("write", "dir/blob.bin", b"new")
    assert call("read", f"{workspace}/dir/blob.bin") == b"new"
    assert os.stat(workspace / "dir" / "blob.bin").st_mode & 0o777 == 0o640
    with pytest.raises(AlreadyExists):
        call("write", "dir/blob.bin", b"x", overwrite=False)
    with pytest.raises(NotFound):
        call("read", "missing.bin")
    with pytest.raises(CorralError):
        call("write", "no/such/dir/f", b"x")  # no create_parents


def test_stat_list_mkdir_copy_remove(call, workspace):
    from corral_client import FailedPrecondition

    assert call("make_directory", "made/deep", recursive=True) == f"{workspace}/made/deep"
    assert oct(os.stat(workspace / "made" / "deep").st_mode & 0o777) == oct(0o755)
    with pytest.raises(AlreadyExists):
        call("make_directory", "made")
    call("write", "made/f.txt", b"twelve bytes", mode=0o640)
    st = call("stat", "made/f.txt")
    assert (st.path, st.kind, st.size, st.mode) == (f"{workspace}/made/f.txt", 1, 12, 0o640)
    assert st.modified_ms > 0
    with pytest.raises(NotFound):
        call("stat", "missing")
    assert call("copy", "made", "copied", recursive=True) == f"{workspace}/copied"
    assert (workspace / "copied" / "f.txt").read_bytes() == b"twelve bytes"
    assert [(e.name, e.kind) for e in call("list_directory", "copied")] == [("deep", 2), ("f.txt", 1)]
    with pytest.raises(FailedPrecondition):
        call("remove", "copied")
    assert call("remove", "copied", recursive=True) == f"{workspace}/copied"
    assert not (workspace / "copied").exists()
    call("remove", "copied", force=True)


def test_a_tree_goes_up_and_comes_back_unchanged(call, workspace, tmp_path):
    src = make_tree(tmp_path / "src", big=3 * MIB + 12345)
    summary = call("upload", src, "copy")
    assert summary.path == f"{workspace}/copy"
    assert (summary.files, summary.directories, summary.symlinks) == (6, 5, 2)
    assert summary.bytes == sum(os.lstat(p).st_size for p in src.rglob("*") if p.is_file() and not p.is_symlink())
    # On the daemon's side, as the session sees it.
    assert snapshot(workspace / "copy") == snapshot(src)
    back = tmp_path / "back"
    down = call("download", "copy", back)
    assert (down.files, down.directories, down.symlinks, list(down.skipped)) == (6, 5, 2, [])
    assert snapshot(back) == snapshot(src)
    for tree in (src, back, workspace / "copy"):
        make_writable(tree)


def test_cp_rule_overwrite_and_skipped_entries(call, rw, workspace, tmp_path):
    f = tmp_path / "one.txt"
    f.write_text("one")
    (workspace / "inbox").mkdir()
    # Into an existing directory: under the source's name.
    assert call("upload", f, "inbox").path == f"{workspace}/inbox/one.txt"
    with pytest.raises(AlreadyExists):
        call("upload", f, "inbox")
    f.write_text("two")
    call("upload", f, "inbox", overwrite=True)
    assert (workspace / "inbox" / "one.txt").read_text() == "two"
    call("upload", f, "deep/er/x.txt", create_parents=True)
    assert (workspace / "deep" / "er" / "x.txt").read_text() == "two"
    # A download skips what is not a file, directory or symlink, and names it.
    os.mkfifo(workspace / "inbox" / "pipe")
    out = tmp_path / "out"
    out.mkdir()
    summary = call("download", "inbox", out)
    assert list(summary.skipped) == ["pipe"]
    assert sorted(os.listdir(out / "inbox")) == ["one.txt"]
    with pytest.raises(FileExistsError):
        call("download", "inbox", out)
    (workspace / "inbox" / "one.txt").write_text("three")
    call("download", "inbox", out, overwrite=True)
    assert (out / "inbox" / "one.txt").read_text() == "three"


def test_an_upload_cancelled_half_way_changes_nothing(call, workspace):
    """A file that changes while it is sent cancels the call: the daemon commits nothing, and
    the session goes on. (/proc files say size 0, then read as text.)"""
    with pytest.raises(TransferChanged, match="grew"):
        call("upload", "/proc/self/status", "status")
    assert not (workspace / "status").exists()
    # The client cancelled and went: the worker removes its staging just after.
    for _ in range(100):
        if not os.listdir(workspace):
            break
        time.sleep(0.05)
    assert sorted(os.listdir(workspace)) == []
    assert call("write", "after.txt", b"ok").size == 2


def test_the_sandbox_rules_hold(client, workspace, tmp_path):
    """A read-only session reads but writes nothing; protected names stay protected."""
    (workspace / "r.txt").write_text("r")
    with client.open_session(workspace, env=session_env(workspace)) as ro:
        try:
            assert ro.files.read("r.txt") == b"r"
        except Unimplemented:
            pytest.skip("this daemon does not serve corral.v1.Files (built before the i12-files merge)")
        with pytest.raises(CorralError):
            ro.files.write("w.txt", b"w")
        f = tmp_path / "f"
        f.write_text("f")
        with pytest.raises(CorralError):
            ro.files.upload(f, "up.txt")
        assert not (workspace / "w.txt").exists() and not (workspace / "up.txt").exists()
    (workspace / ".git").mkdir()
    with client.open_session(workspace, "workspace-write", env=session_env(workspace)) as rw:
        with pytest.raises(CorralError):
            rw.files.write(".git/config", b"[core]\n")
        assert not (workspace / ".git" / "config").exists()
