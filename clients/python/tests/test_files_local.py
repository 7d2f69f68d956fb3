"""The local side of uploads and downloads, against a stand-in Files server (a Python gRPC server
with the corral.v1.Files service) that records what it gets and sends crafted streams: the upload
stream's exact shape, a file changed mid-upload cancelling the call, a download written with its
modes and symlinks, and hostile download streams refused with nothing left behind."""

from __future__ import annotations

import os
import stat
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from corral_client import TransferChanged, aio, files, pb
from corral_client._proto import corral_pb2_grpc as pb_grpc
from files_helpers import Api, make_tree, make_writable, snapshot

SID = "s" * 32
FILE, DIR, LINK = pb.ENTRY_KIND_FILE, pb.ENTRY_KIND_DIRECTORY, pb.ENTRY_KIND_SYMLINK


class StandIn(pb_grpc.FilesServicer):
    def __init__(self):
        self.uploads: list[tuple[list[pb.UploadRequest], bool]] = []  # (requests, complete)
        self.script: list[pb.DownloadResponse] = []
        self.downloads: list[pb.DownloadRequest] = []
        self.lock = threading.Lock()
        self.settle = 0.0

    def Upload(self, request_iterator, context):
        # Whether the stream ended (the client half-closed it: complete) or broke (cancelled).
        # grpcio's server may end the iteration of a cancelled stream as if it were complete
        # and mark the call cancelled a moment later: `settle` gives it that moment.
        got, complete = [], False
        try:
            for r in request_iterator:
                got.append(r)
            complete = True
        except grpc.RpcError:
            pass
        deadline = time.monotonic() + self.settle
        while complete and time.monotonic() < deadline:
            complete = context.is_active()
            time.sleep(0.01)
        with self.lock:
            self.uploads.append((got, complete))
        files_ = sum(1 for r in got if r.WhichOneof("item") == "entry" and r.entry.kind == FILE)
        return pb.UploadResponse(summary=pb.TransferSummary(path="/remote/dest", files=files_))

    def Download(self, request, context):
        self.downloads.append(request)
        yield from self.script


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    d = tmp_path_factory.mktemp("files-stand-in")
    os.chmod(d, 0o700)
    sock = d / "s.sock"
    servicer = StandIn()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_FilesServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{sock}")
    server.start()
    yield servicer, str(sock)
    server.stop(grace=None)


@pytest.fixture(params=["sync", "async"])
def api(request, stand_in):
    servicer, sock = stand_in
    servicer.uploads.clear()
    servicer.downloads.clear()
    servicer.settle = 0.0
    return Api(request.param, sock, SID), servicer


def entries(requests):
    return [r.entry for r in requests if r.WhichOneof("item") == "entry"]


def file_data(requests):
    """Each file entry's path and the data messages that followed it."""
    out, current = {}, None
    *body, finish = requests[1:]
    assert finish.WhichOneof("item") == "finish", "the stream ends with its finish"
    sent_entries = sum(1 for r in body if r.WhichOneof("item") == "entry")
    sent_bytes = sum(len(r.data) for r in body if r.WhichOneof("item") == "data")
    assert (finish.finish.entries, finish.finish.bytes) == (sent_entries, sent_bytes)
    for r in body:
        kind = r.WhichOneof("item")
        if kind == "entry":
            current = r.entry.path if r.entry.kind == FILE else None
            if current is not None:
                out[current] = []
        else:
            assert kind == "data" and current is not None, "data outside a file entry"
            out[current].append(r.data)
    return out


def test_the_upload_stream_is_the_tree_parents_first_with_modes_and_exact_bytes(api, tmp_path):
    call, servicer = api
    src = make_tree(tmp_path / "src", big=(5 << 20) // 2)
    os.mkfifo(src / "sub" / "pipe")
    summary = call("upload", src, "dest", overwrite=True, create_parents=True)
    assert list(summary.skipped) == ["sub/pipe"] and summary.files == 6 and summary.path == "/remote/dest"
    [(requests, complete)] = servicer.uploads
    assert complete
    start = requests[0].start
    assert (start.session_id, start.path, start.source_name, start.overwrite, start.create_parents) == (
        SID, "dest", "src", True, True
    )  # fmt: skip
    assert all(r.WhichOneof("item") != "start" for r in requests[1:])
    want = snapshot(src)
    del want["sub/pipe"]
    got = {}
    data = file_data(requests)
    seen = set()
    for e in entries(requests):
        parent = e.path.rsplit("/", 1)[0] if "/" in e.path else ""
        assert e.path == "" or parent in seen, f"{e.path} before its directory"
        seen.add(e.path)
        if e.kind == DIR:
            got[e.path] = ("dir", e.mode)
        elif e.kind == LINK:
            assert not e.HasField("mode")
            got[e.path] = ("link", e.link_target)
        else:
            assert e.kind == FILE
            chunks = data[e.path]
            assert all(0 < len(c) <= files.CHUNK_BYTES for c in chunks)
            assert sum(map(len, chunks)) == e.size
            got[e.path] = ("file", e.mode, b"".join(chunks))
    assert list(got)[0] == "" and got == want
    assert len(data["big.bin"]) == 3  # 2.5 MiB in chunks of at most 1 MiB
    make_writable(src)


def test_a_single_file_and_a_symlink_upload_as_roots(api, tmp_path):
    call, servicer = api
    f = tmp_path / "one.txt"
    f.write_bytes(b"\x00\x01binary")
    os.chmod(f, 0o604)
    call("upload", f, "remote.txt")
    os.symlink("/etc/hostname", tmp_path / "ln")
    call("upload", tmp_path / "ln", "remote-link")
    (file_reqs, _), (link_reqs, _) = servicer.uploads
    assert file_reqs[0].start.source_name == "one.txt"
    assert [(e.path, e.kind, e.mode, e.size) for e in entries(file_reqs)] == [("", FILE, 0o604, 8)]
    assert file_data(file_reqs) == {"": [b"\x00\x01binary"]}
    assert [(e.path, e.kind, e.link_target) for e in entries(link_reqs)] == [("", LINK, "/etc/hostname")]
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ValueError, match="not a file, a directory or a symlink"):
        call("upload", tmp_path / "fifo", "x")
    assert len(servicer.uploads) == 2  # refused before calling


@pytest.mark.parametrize("change", ["grew", "shrank", "replaced"])
def test_a_file_that_changes_during_the_upload_cancels_it(api, tmp_path, monkeypatch, change):
    call, servicer = api
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a" * 100)
    (src / "b").write_bytes(b"b" * 100)
    planned = files.plan_upload(src)
    if change == "grew":
        (src / "b").write_bytes(b"b" * 101)
    elif change == "shrank":
        (src / "b").write_bytes(b"b" * 99)
    else:
        (src / "c").write_bytes(b"c" * 100)
        os.replace(src / "c", src / "b")
    for module in (files, aio):
        monkeypatch.setattr(module, "plan_upload", lambda _path: planned)
    servicer.settle = 0.5
    with pytest.raises(TransferChanged, match=change):
        call("upload", src, "dest")
    # The call was cancelled, not ended: a server that got to it saw no complete stream.
    deadline = time.monotonic() + 3
    while not servicer.uploads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(not complete for _, complete in servicer.uploads)


def entry(path, kind, mode=None, size=0, link_target=""):
    e = pb.TransferEntry(path=path, kind=kind, size=size, link_target=link_target)
    if mode is not None:
        e.mode = mode
    return pb.DownloadResponse(entry=e)


def data(b):
    return pb.DownloadResponse(data=b)


SUMMARY = pb.DownloadResponse(summary=pb.TransferSummary(path="/remote/tree", files=3, skipped=["fifo"]))


def good_tree():
    return [
        entry("", DIR, 0o750),
        entry("a.txt", FILE, 0o640, size=6),
        data(b"hel"),
        data(b"lo\n"),
        entry("ro", DIR, 0o555),
        entry("ro/x", FILE, 0o444, size=1),
        data(b"x"),
        entry("exe", FILE, 0o755),
        entry("link", LINK, link_target="a.txt"),
        entry("nomode", FILE, size=0),
        SUMMARY,
    ]


def test_a_download_is_written_with_modes_and_symlinks(api, tmp_path):
    call, servicer = api
    servicer.script = good_tree()
    out = tmp_path / "out"
    summary = call("download", "tree", out)
    assert (summary.path, summary.files, list(summary.skipped)) == ("/remote/tree", 3, ["fifo"])
    assert servicer.downloads[0] == pb.DownloadRequest(session_id=SID, path="tree")
    assert snapshot(out) == {
        "": ("dir", 0o750),
        "a.txt": ("file", 0o640, b"hello\n"),
        "exe": ("file", 0o755, b""),
        "link": ("link", "a.txt"),
        "nomode": ("file", 0o644, b""),
        "ro": ("dir", 0o555),
        "ro/x": ("file", 0o444, b"x"),
    }
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no staging left behind
    # Into an existing directory: under the remote name (cp's rule).
    want = snapshot(out)
    call("download", "some/where/tree", tmp_path / "out")
    assert snapshot(out / "tree") == want
    make_writable(tmp_path)


def test_download_overwrite_rules(api, tmp_path):
    call, servicer = api
    servicer.script = [entry("", FILE, 0o600, size=3), data(b"new"), SUMMARY]
    dest = tmp_path / "f"
    dest.write_text("old")
    with pytest.raises(FileExistsError):
        call("download", "f", dest)
    assert dest.read_text() == "old" and servicer.downloads == []  # refused before calling
    call("download", "f", dest, overwrite=True)
    assert dest.read_text() == "new" and stat.S_IMODE(dest.stat().st_mode) == 0o600
    # A directory by a directory (downloaded into the parent, cp's rule): the old tree is gone,
    # not merged.
    d = tmp_path / "d"
    (d / "old-child").mkdir(parents=True)
    servicer.script = [entry("", DIR, 0o700), entry("new-child", FILE, size=0), SUMMARY]
    with pytest.raises(FileExistsError):
        call("download", "remote/d", tmp_path)
    call("download", "remote/d", tmp_path, overwrite=True)
    assert sorted(os.listdir(d)) == ["new-child"]
    # Not a file over a directory.
    servicer.script = [entry("", FILE, size=0), SUMMARY]
    with pytest.raises(IsADirectoryError):
        call("download", "remote/d", tmp_path, overwrite=True)
    assert sorted(os.listdir(d)) == ["new-child"]
    assert sorted(os.listdir(tmp_path)) == ["d", "f"]


HOSTILE = {
    "parent escape": [entry("", DIR), entry("../escape", FILE, size=0), SUMMARY],
    "absolute path": [entry("", DIR), entry("/tmp/corral-hostile-abs", FILE, size=0), SUMMARY],
    "dot-dot inside": [entry("", DIR), entry("a", DIR), entry("a/../b", FILE, size=0), SUMMARY],
    "through its own symlink": [entry("", DIR), entry("a", LINK, link_target="../here"), entry("a/x", FILE, size=0), SUMMARY],
    "below a file": [entry("", DIR), entry("f", FILE, size=0), entry("f/x", FILE, size=0), SUMMARY],
    "child before parent": [entry("", DIR), entry("d/x", FILE, size=0), SUMMARY],
    "duplicate": [entry("", DIR), entry("a", FILE, size=0), entry("a", FILE, size=0), SUMMARY],
    "duplicate over a symlink": [entry("", DIR), entry("a", LINK, link_target="../here/x"), entry("a", FILE, size=0), SUMMARY],
    "more bytes than announced": [entry("", FILE, size=2), data(b"abc"), SUMMARY],
    "fewer bytes, then an entry": [entry("", DIR), entry("a", FILE, size=5), data(b"ab"), entry("b", DIR), SUMMARY],
    "fewer bytes, then the end": [entry("", FILE, size=5), data(b"ab"), SUMMARY],
    "no summary": [entry("", DIR), entry("a", FILE, size=0)],
    "first entry not the root": [entry("a", FILE, size=0), SUMMARY],
    "data before any entry": [data(b"x"), entry("", FILE, size=1), SUMMARY],
    "a second root": [entry("", DIR), entry("", DIR), SUMMARY],
    "an OTHER entry": [entry("", DIR), entry("dev", pb.ENTRY_KIND_OTHER), SUMMARY],
    "a NUL in a name": [entry("", DIR), entry("a\0b", FILE, size=0), SUMMARY],
    "nothing but a summary": [SUMMARY],
    "more after the summary": [entry("", DIR), SUMMARY, entry("late", FILE, size=0)],
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_download_stream_is_refused_and_leaves_nothing(api, tmp_path, name):
    call, servicer = api
    servicer.script = HOSTILE[name]
    (tmp_path / "here").mkdir()
    before = sorted(os.listdir(tmp_path))
    with pytest.raises((ValueError, FileExistsError, FileNotFoundError, NotADirectoryError)):
        call("download", "tree", tmp_path / "out")
    # Nothing beside the destination (no staging left, nothing escaped to ../), nothing written
    # through a symlink the stream made (into ../here), nothing at the absolute path.
    assert sorted(os.listdir(tmp_path)) == before
    assert os.listdir(tmp_path / "here") == []
    assert not os.path.lexists("/tmp/corral-hostile-abs")
