"""Byte-exact file transfer into and out of a session: the ``corral.v1.Files`` service.

``session.files.read(path)`` and ``write(path, data)`` move one small file (at most 3 MiB) as
bytes; ``upload(local, remote)`` and ``download(remote, local)`` move a file or a whole directory
tree of any size, with permission bits, symlinks as symlinks (never followed). The daemon reads and
writes only what the session's commands could, and its writes are atomic; so are this side's: a
download appears complete under its name, or not at all.

When the destination is an existing directory, the copy lands inside it under the source's name
(cp's rule); otherwise the destination is the copy. An existing copy is replaced only with
``overwrite=True`` (a file by a file, a directory by a directory).
"""

from __future__ import annotations

import logging
import os
import posixpath
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

from ._proto import corral_pb2 as pb
from .errors import CorralError

if TYPE_CHECKING:  # pragma: no cover
    from .client import Session

__all__ = ["Files", "TransferChanged"]

PathLike = Union[str, "os.PathLike[str]"]

# The largest data message of a transfer (UploadRequest.data: "chunks of at most 1 MiB").
CHUNK_BYTES = 1024 * 1024
_FILE, _DIR, _LINK = pb.ENTRY_KIND_FILE, pb.ENTRY_KIND_DIRECTORY, pb.ENTRY_KIND_SYMLINK


class TransferChanged(OSError):
    """A local file changed (grew, shrank or was replaced) while it was being uploaded: the
    upload was cancelled, and the daemon changed nothing."""


# -- read / write ---------------------------------------------------------------------------


def write_request(
    session_id: str, path: PathLike, data: bytes, *, mode: int | None, create_parents: bool, overwrite: bool
) -> pb.WriteBytesRequest:
    req = pb.WriteBytesRequest(
        session_id=session_id,
        path=os.fspath(path),
        data=bytes(data),
        create_parents=create_parents,
        no_overwrite=not overwrite,
    )
    if mode is not None:
        req.mode = mode
    return req


# -- upload ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Node:
    rel: str  # '/'-separated, "" for the root
    path: str  # the local path
    st: os.stat_result
    link_target: str = ""


def _utf8(name: str, path: str) -> str:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{path!r}: corral transfers UTF-8 names only") from None
    return name


def plan_upload(local_path: PathLike) -> tuple[list[_Node], list[str]]:
    """The tree under ``local_path``, parents before children (nothing followed), and the
    relative paths of what cannot be sent (FIFOs, sockets, devices). Walked before the call
    starts, so an unreadable directory fails here and not half-way through the stream."""
    root = os.fspath(local_path)
    nodes: list[_Node] = []
    skipped: list[str] = []

    def visit(rel: str, path: str) -> None:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            nodes.append(_Node(rel, path, st, _utf8(os.readlink(path), path)))
        elif stat.S_ISREG(st.st_mode):
            nodes.append(_Node(rel, path, st))
        elif stat.S_ISDIR(st.st_mode):
            nodes.append(_Node(rel, path, st))
            for name in sorted(os.listdir(path)):
                visit(posixpath.join(rel, _utf8(name, path)) if rel else _utf8(name, path), os.path.join(path, name))
        elif rel:
            skipped.append(rel)
        else:
            raise ValueError(f"{root!r} is not a file, a directory or a symlink")

    visit("", root)
    return nodes, skipped


def upload_requests(
    session_id: str, local_path: PathLike, remote_path: PathLike, nodes: list[_Node], *, overwrite: bool, create_parents: bool
) -> Iterator[pb.UploadRequest]:
    """The Upload stream: the start, then each node's entry, a file's entry followed by exactly
    its bytes, then the finish that commits it. A file that changed since :func:`plan_upload` raises :class:`TransferChanged`
    (the caller cancels the call: the daemon commits only a complete stream)."""
    name = os.path.basename(os.path.normpath(os.path.abspath(os.fspath(local_path))))
    yield pb.UploadRequest(
        start=pb.UploadStart(
            session_id=session_id,
            path=os.fspath(remote_path),
            source_name=_utf8(name, name),
            overwrite=overwrite,
            create_parents=create_parents,
        )
    )
    for node in nodes:
        mode = stat.S_IMODE(node.st.st_mode) & 0o777
        if stat.S_ISLNK(node.st.st_mode):
            yield pb.UploadRequest(entry=pb.TransferEntry(path=node.rel, kind=_LINK, link_target=node.link_target))
        elif stat.S_ISDIR(node.st.st_mode):
            yield pb.UploadRequest(entry=pb.TransferEntry(path=node.rel, kind=_DIR, mode=mode))
        else:
            yield pb.UploadRequest(entry=pb.TransferEntry(path=node.rel, kind=_FILE, mode=mode, size=node.st.st_size))
            yield from _file_data(node)
    # Only a stream that reaches its finish is committed (each file sent exactly its size, or
    # TransferChanged was raised above): a cancelled call can look like an ended one.
    sent = sum(n.st.st_size for n in nodes if stat.S_ISREG(n.st.st_mode))
    yield pb.UploadRequest(finish=pb.UploadFinish(entries=len(nodes), bytes=sent))


def _file_data(node: _Node) -> Iterator[pb.UploadRequest]:
    # O_NOFOLLOW and the inode check: the file read is the one walked, not a symlink or another
    # file swapped in since.
    fd = os.open(node.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (node.st.st_dev, node.st.st_ino):
            raise TransferChanged(f"{node.path} was replaced while it was being uploaded")
        left = node.st.st_size
        while left:
            data = f.read(min(left, CHUNK_BYTES))
            if not data:
                raise TransferChanged(f"{node.path} shrank while it was being uploaded")
            left -= len(data)
            yield pb.UploadRequest(data=data)
        if f.read(1):
            raise TransferChanged(f"{node.path} grew while it was being uploaded")


class _StopUpload(Exception):
    """Raised into gRPC to cancel an upload whose stream broke (see :class:`RequestStream`)."""


class _QuietStop(logging.Filter):
    """grpcio logs every exception of a request iterator with its traceback; for
    :class:`_StopUpload` the caller gets the real error raised, so the log would only repeat it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], _StopUpload))


logging.getLogger("grpc._channel").addFilter(_QuietStop())


class RequestStream:
    """Iterates the upload stream for gRPC and keeps what broke it. The call must be cancelled,
    not ended (an ended stream could look complete to the daemon), and gRPC cancels a call whose
    request iterator raises, reporting only its own status: so the iterator raises
    :class:`_StopUpload` and the caller raises :attr:`error` instead."""

    def __init__(self, requests: Iterator[pb.UploadRequest]):
        self._requests = requests
        self.error: BaseException | None = None

    def __iter__(self) -> RequestStream:
        return self

    def __next__(self) -> pb.UploadRequest:
        try:
            return next(self._requests)
        except StopIteration:
            raise
        except Exception as e:
            self.error = e
            raise _StopUpload(str(e)) from e


def upload_summary(resp: pb.UploadResponse, skipped: list[str]) -> pb.TransferSummary:
    summary = pb.TransferSummary()
    summary.CopyFrom(resp.summary)
    summary.skipped.extend(skipped)
    return summary


# -- download -------------------------------------------------------------------------------


def download_destination(remote_path: PathLike, local_path: PathLike) -> str:
    """Where a download lands: inside ``local_path`` when it is a directory (cp's rule, when the
    remote path has a name), else ``local_path`` itself."""
    local = os.path.abspath(os.fspath(local_path))
    name = posixpath.basename(posixpath.normpath(os.fspath(remote_path)))
    if os.path.isdir(local) and name not in ("", ".", "..", "/"):
        return os.path.join(local, name)
    return local


class DownloadSink:
    """Writes a Download stream to the local disk: everything goes into a private staging
    directory beside the destination, and the finished tree is renamed into place; on any error
    the staging directory is removed and the destination is untouched.

    The stream is checked as it comes: entry paths are relative with normal components only,
    every parent is a directory made by this download (so nothing is written through a symlink
    the stream created), each file gets exactly the bytes its entry announced."""

    def __init__(self, remote_path: PathLike, local_path: PathLike, *, overwrite: bool):
        self.dest = download_destination(remote_path, local_path)
        if os.path.lexists(self.dest) and not overwrite:
            raise FileExistsError(f"{self.dest} exists (pass overwrite=True to replace it)")
        self.overwrite = overwrite
        self._stage = tempfile.mkdtemp(prefix=f".{os.path.basename(self.dest)}.", dir=os.path.dirname(self.dest))
        self._root = os.path.join(self._stage, "root")
        self._root_kind: int | None = None
        self._dirs: dict[str, int] = {}  # rel -> mode, applied once the tree is complete
        self._file: Any = None
        self._left = 0
        self._file_path = ""
        self.summary: pb.TransferSummary | None = None

    # The stream, message by message.

    def feed(self, msg: pb.DownloadResponse) -> None:
        kind = msg.WhichOneof("item")
        if self.summary is not None:
            raise ValueError("the download stream went on after its summary")
        if kind == "data":
            if self._file is None or len(msg.data) > self._left:
                raise ValueError(f"the download stream sent more bytes than announced for {self._file_path or 'no file'}")
            self._file.write(msg.data)
            self._left -= len(msg.data)
            return
        self._finish_file()
        if kind == "entry":
            self._entry(msg.entry)
        elif kind == "summary":
            if self._root_kind is None:
                raise ValueError("the download stream ended without any entry")
            self.summary = msg.summary

    def _path(self, rel: str) -> str:
        if self._root_kind is None:
            if rel != "":
                raise ValueError(f"the download stream's first entry is {rel!r}, not the root")
            return self._root
        parts = rel.split("/")
        if rel == "" or any(p in ("", ".", "..") or "\0" in p for p in parts):
            raise ValueError(f"the download stream sent an invalid path {rel!r}")
        parent = "/".join(parts[:-1])
        if parent not in self._dirs:
            raise ValueError(f"the download stream sent {rel!r} before its directory")
        return os.path.join(self._root, *parts)

    def _entry(self, e: pb.TransferEntry) -> None:
        path = self._path(e.path)
        if self._root_kind is None:
            self._root_kind = e.kind
        mode = e.mode & 0o777 if e.HasField("mode") else None
        if e.kind == _DIR:
            os.mkdir(path, 0o700)  # writable by us until the tree is complete
            self._dirs[e.path] = 0o755 if mode is None else mode
        elif e.kind == _FILE:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            self._file = os.fdopen(fd, "wb")
            self._left = e.size
            self._file_path = e.path or self.dest
            os.fchmod(fd, 0o644 if mode is None else mode)
        elif e.kind == _LINK:
            os.symlink(e.link_target, path)
        else:
            raise ValueError(f"the download stream sent an entry of kind {e.kind} for {e.path!r}")

    def _finish_file(self) -> None:
        if self._file is None:
            return
        f, self._file = self._file, None
        f.close()
        if self._left:
            raise ValueError(f"the download stream sent {self._left} bytes less than announced for {self._file_path}")

    # The end.

    def commit(self) -> pb.TransferSummary:
        """Puts the finished tree in place (replacing the destination if allowed)."""
        if self.summary is None:
            raise ValueError("the download stream ended without its summary")
        for rel in sorted(self._dirs, key=lambda r: -r.count("/") if r else 1):
            os.chmod(os.path.join(self._root, *rel.split("/")) if rel else self._root, self._dirs[rel])
        try:
            old = os.lstat(self.dest)
        except FileNotFoundError:
            old = None
        if old is None:
            os.rename(self._root, self.dest)
        elif not self.overwrite:
            raise FileExistsError(f"{self.dest} appeared during the download")
        elif stat.S_ISDIR(old.st_mode) != (self._root_kind == _DIR):
            what = "a directory" if stat.S_ISDIR(old.st_mode) else "not a directory"
            raise IsADirectoryError(f"{self.dest} is {what}; a download replaces only its own kind")
        elif stat.S_ISDIR(old.st_mode):
            # rename(2) does not replace a non-empty directory: the old tree steps aside first.
            aside = os.path.join(self._stage, "old")
            os.rename(self.dest, aside)
            os.rename(self._root, self.dest)
        else:
            os.replace(self._root, self.dest)
        self.close()
        return self.summary

    def close(self) -> None:
        """Removes the staging directory (after a commit, or instead of one)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        # Directories made read-only by the stream's modes must be writable to be removed.
        for dirpath, dirnames, _ in os.walk(self._stage):
            for d in dirnames:
                p = os.path.join(dirpath, d)
                if not os.path.islink(p):
                    os.chmod(p, 0o700)
        shutil.rmtree(self._stage, ignore_errors=True)


# -- the sync API ---------------------------------------------------------------------------


class Files:
    """``session.files``: byte-exact reads, writes, uploads and downloads in the session."""

    def __init__(self, session: Session):
        self.session = session

    def read(self, path: PathLike, *, timeout: Optional[float] = None) -> bytes:
        """The whole file (at most 3 MiB; larger: :meth:`download`), as bytes."""
        req = pb.ReadBytesRequest(session_id=self.session.id, path=os.fspath(path))
        return self.session.client._unary("files", "ReadBytes", req, timeout).data

    def write(
        self,
        path: PathLike,
        data: bytes,
        *,
        mode: Optional[int] = None,
        create_parents: bool = False,
        overwrite: bool = True,
        timeout: Optional[float] = None,
    ) -> pb.WriteBytesResponse:
        """Writes ``data`` as the whole file, atomically (at most 3 MiB; larger: :meth:`upload`).
        ``mode``: permission bits (at most 0o777; default: the replaced file's, else 0o644);
        ``create_parents``: make missing directories; ``overwrite=False``: AlreadyExists if the
        path exists. Returns ``WriteBytesResponse(path, size)``."""
        req = write_request(
            self.session.id, path, data, mode=mode, create_parents=create_parents, overwrite=overwrite
        )
        return self.session.client._unary("files", "WriteBytes", req, timeout)

    def stat(
        self, path: PathLike, *, follow_symlinks: bool = False, timeout: Optional[float] = None
    ) -> pb.StatResponse:
        """What is at ``path``: ``StatResponse(path, kind, size, mode, modified_ms, created_ms)``
        (``kind``: an ``ENTRY_KIND_*``; a final symlink is described itself unless
        ``follow_symlinks``). A missing path raises ``NotFound``."""
        req = pb.StatRequest(session_id=self.session.id, path=os.fspath(path), follow_symlinks=follow_symlinks)
        return self.session.client._unary("files", "Stat", req, timeout)

    def list_directory(self, path: PathLike, *, timeout: Optional[float] = None) -> list[pb.DirectoryEntry]:
        """The directory's entries (``name``, ``kind``), sorted by name, without ``.``/``..``."""
        req = pb.ListDirectoryRequest(session_id=self.session.id, path=os.fspath(path))
        return list(self.session.client._unary("files", "ListDirectory", req, timeout).entries)

    def make_directory(self, path: PathLike, *, recursive: bool = False, timeout: Optional[float] = None) -> str:
        """Creates a directory (0755); ``recursive``: ``mkdir -p``. Returns its resolved path."""
        req = pb.MakeDirectoryRequest(session_id=self.session.id, path=os.fspath(path), recursive=recursive)
        return self.session.client._unary("files", "MakeDirectory", req, timeout).path

    def remove(
        self, path: PathLike, *, recursive: bool = False, force: bool = False, timeout: Optional[float] = None
    ) -> str:
        """``rm [-r] [-f]``: a symlink is removed itself, never followed. Returns the resolved path."""
        req = pb.RemoveRequest(session_id=self.session.id, path=os.fspath(path), recursive=recursive, force=force)
        return self.session.client._unary("files", "Remove", req, timeout).path

    def copy(
        self, source: PathLike, destination: PathLike, *, recursive: bool = False, timeout: Optional[float] = None
    ) -> str:
        """Copies within the session to exactly ``destination`` (symlinks as symlinks; a directory
        needs ``recursive`` and a new destination). Returns the destination's resolved path."""
        req = pb.CopyRequest(
            session_id=self.session.id,
            source_path=os.fspath(source),
            destination_path=os.fspath(destination),
            recursive=recursive,
        )
        return self.session.client._unary("files", "Copy", req, timeout).path

    def upload(
        self,
        local_path: PathLike,
        remote_path: PathLike,
        *,
        overwrite: bool = False,
        create_parents: bool = False,
        timeout: Optional[float] = None,
    ) -> pb.TransferSummary:
        """Copies a local file, symlink or directory tree into the session (see the module's
        rules). FIFOs, sockets and devices are skipped and named in the summary's ``skipped``.
        ``timeout``: the whole transfer's deadline (default: none)."""
        nodes, skipped = plan_upload(local_path)
        stream = RequestStream(
            upload_requests(
                self.session.id, local_path, remote_path, nodes, overwrite=overwrite, create_parents=create_parents
            )
        )
        try:
            resp = self.session.client._stream_unary("files", "Upload", stream, timeout)
        except CorralError:
            if stream.error is not None:  # the call was cancelled because of it
                raise stream.error from None
            raise
        return upload_summary(resp, skipped)

    def download(
        self,
        remote_path: PathLike,
        local_path: PathLike,
        *,
        overwrite: bool = False,
        timeout: Optional[float] = None,
    ) -> pb.TransferSummary:
        """Copies a file, symlink or directory tree of the session to ``local_path`` (see the
        module's rules). Returns the summary (``skipped``: FIFOs, sockets and devices left out).
        ``timeout``: the whole transfer's deadline (default: none)."""
        sink = DownloadSink(remote_path, local_path, overwrite=overwrite)
        try:
            req = pb.DownloadRequest(session_id=self.session.id, path=os.fspath(remote_path))
            for msg in self.session.client._unary_stream("files", "Download", req, timeout):
                sink.feed(msg)
            return sink.commit()
        finally:
            sink.close()
