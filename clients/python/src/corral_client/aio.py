"""The corral client on ``asyncio`` (``grpc.aio``): the same verbs as :mod:`corral_client.client`,
awaited.

    import asyncio
    from corral_client.aio import AsyncClient

    async def main():
        async with AsyncClient() as client:
            async with await client.open_session(".") as s:
                print((await s.read_file("README.md", limit=5)).text)
                proc = await s.processes.start(["make", "test"])
                async for chunk in proc.follow():
                    print(chunk.data.decode(), end="")

    asyncio.run(main())

Requests, answers, the follower's bookkeeping and the transfers' local side are the sync client's
(:mod:`corral_client._core`, :mod:`~corral_client.processes`, :mod:`~corral_client.files`); only
the calls differ. Local file I/O of uploads and downloads runs in worker threads
(:func:`asyncio.to_thread`), so the event loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, Optional

import grpc
import grpc.aio

from . import _core
from ._core import DEFAULT_MODE, PathLike
from ._proto import corral_pb2 as pb
from .client import SessionBase
from .errors import CorralError, Unavailable, from_rpc_error
from .files import (
    DownloadSink,
    RequestStream,
    plan_upload,
    upload_requests,
    upload_summary,
    write_request,
)
from .processes import (
    _PAST_THE_END,
    Cursor,
    FollowCore,
    OutputChunk,
    ProcessBase,
    ProcessInfo,
    ProcessState,
    ReadResult,
    WaitClock,
    _signal_name,
    process_infos,
    read_request,
    read_result,
    read_timeout,
    start_request,
    terminated_state,
)
from .processes import write_request as process_write_request

__all__ = [
    "AsyncClient",
    "AsyncFiles",
    "AsyncFollow",
    "AsyncProcess",
    "AsyncProcesses",
    "AsyncSession",
    "AsyncShellStream",
]

_END = object()


async def _in_thread(iterator: Iterator[Any]) -> AsyncIterator[Any]:
    """A blocking iterator (one reading local files) as an async one, each step in a thread."""
    while True:
        item = await asyncio.to_thread(next, iterator, _END)
        if item is _END:
            return
        yield item


class AsyncClient:
    """A connection to a corral daemon, for ``asyncio``.

    Takes the same arguments as :class:`corral_client.Client` (target, TLS, ``timeout`` — the
    default deadline of unary calls —, ``metadata``, ``options``) and has the same methods, as
    coroutines. Use it as an async context manager (``async with AsyncClient() as client``), or
    ``await client.close()``. Create it inside the event loop that uses it.
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | None = None,
        *,
        tls: bool = False,
        root_certificates: bytes | str | None = None,
        private_key: bytes | str | None = None,
        certificate_chain: bytes | str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        server_name: str | None = None,
        timeout: float | None = None,
        metadata: Sequence[tuple[str, str]] | None = None,
        options: Sequence[tuple[str, Any]] | None = None,
        token: str | None = None,
    ):
        self.target, credentials, opts = _core.channel_settings(
            target,
            tls=tls,
            root_certificates=root_certificates,
            private_key=private_key,
            certificate_chain=certificate_chain,
            credentials=credentials,
            server_name=server_name,
            options=options,
            token=token,
        )
        if credentials is not None:
            self._channel = grpc.aio.secure_channel(self.target, credentials, options=opts)
        else:
            self._channel = grpc.aio.insecure_channel(self.target, options=opts)
        self.timeout = timeout
        self.metadata = tuple(metadata or ())
        self._stubs = _core.Stubs(self._channel)

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def channel(self) -> grpc.aio.Channel:
        """The underlying ``grpc.aio`` channel (for other services on the same daemon)."""
        return self._channel

    def _method(self, service: str, method: str) -> Any:
        return getattr(getattr(self._stubs, service), method)

    async def _unary(self, service: str, method: str, request: Any, timeout: float | None) -> Any:
        try:
            return await self._method(service, method)(
                request,
                timeout=self.timeout if timeout is None else timeout,
                metadata=self.metadata or None,
            )
        except grpc.RpcError as e:
            raise _core.explain(self.target, from_rpc_error(e)) from None

    async def _unary_stream(
        self, service: str, method: str, request: Any, timeout: float | None
    ) -> AsyncIterator[Any]:
        call = self._method(service, method)(request, timeout=timeout, metadata=self.metadata or None)
        try:
            async for msg in call:
                yield msg
        except grpc.RpcError as e:
            raise _core.explain(self.target, from_rpc_error(e)) from None
        finally:
            call.cancel()  # a no-op once the call is over; stops it when the caller stops early

    async def _stream_unary(self, service: str, method: str, requests: Any, timeout: float | None) -> Any:
        try:
            return await self._method(service, method)(
                requests, timeout=timeout, metadata=self.metadata or None
            )
        except grpc.RpcError as e:
            raise _core.explain(self.target, from_rpc_error(e)) from None

    async def close(self) -> None:
        """Closes the channel (sessions stay open on the daemon until closed or expired)."""
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait_ready(self, timeout: float = 10.0) -> None:
        """Waits until the channel connects; raises :class:`~corral_client.Unavailable` if not."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except asyncio.TimeoutError:
            raise _core.explain(
                self.target,
                Unavailable(grpc.StatusCode.UNAVAILABLE, f"corral at {self.target} did not answer in {timeout}s"),
            ) from None

    # -- health and sessions ----------------------------------------------------------------

    async def health(self, service: str = "", *, timeout: float | None = None) -> str:
        """See :meth:`corral_client.Client.health`."""
        return _core.health_status(await self._unary("health", "Check", _core.health_request(service), timeout))

    async def capabilities(self, *, timeout: float | None = None) -> pb.GetCapabilitiesResponse:
        """See :meth:`corral_client.Client.capabilities`."""
        return await self._unary("sessions", "GetCapabilities", pb.GetCapabilitiesRequest(), timeout)

    async def open_session(
        self,
        cwd: PathLike | None = None,
        mode: str | int = DEFAULT_MODE,
        *,
        writable_roots: Sequence[PathLike] = (),
        network_access: bool = False,
        env: Mapping[str, str] | None = None,
        exclude_tmpdir_env_var: bool = False,
        exclude_slash_tmp: bool = False,
        profile: str | None = None,
        shell_tool: str | int | None = None,
        apply_patch_tool: str | int | None = None,
        update_plan: bool | None = None,
        view_image: bool | None = None,
        no_image_input: bool = False,
        background_terminal_max_timeout_ms: int | None = None,
        approval_policy: str | int | None = None,
        approval_timeout_ms: int | None = None,
        network: str | int | None = None,
        allow_domains: Sequence[str] = (),
        deny_domains: Sequence[str] = (),
        timeout: float | None = None,
    ) -> AsyncSession:
        """Opens a session (``async with await client.open_session(...) as s``); the settings
        and their defaults are :meth:`corral_client.Client.open_session`'s (``mode``:
        ``"read-only"``)."""
        req = _core.open_session_request(
            cwd, mode, writable_roots=writable_roots, network_access=network_access, env=env,
            exclude_tmpdir_env_var=exclude_tmpdir_env_var, exclude_slash_tmp=exclude_slash_tmp,
            profile=profile, shell_tool=shell_tool, apply_patch_tool=apply_patch_tool,
            update_plan=update_plan, view_image=view_image, no_image_input=no_image_input,
            background_terminal_max_timeout_ms=background_terminal_max_timeout_ms,
            approval_policy=approval_policy, approval_timeout_ms=approval_timeout_ms,
            network=network, allow_domains=allow_domains, deny_domains=deny_domains,
        )  # fmt: skip
        return AsyncSession(self, await self._unary("sessions", "OpenSession", req, timeout))

    async def set_network_rules(
        self,
        session_id: str,
        allow_domains: Sequence[str] = (),
        deny_domains: Sequence[str] = (),
        *,
        timeout: float | None = None,
    ) -> None:
        """See :meth:`corral_client.Client.set_network_rules`."""
        req = _core.set_network_rules_request(session_id, allow_domains, deny_domains)
        await self._unary("sessions", "SetNetworkRules", req, timeout)

    def session(self, session_id: str) -> AsyncSession:
        """Attaches to a session opened earlier (by this or another client): nothing is sent, an
        unknown id fails on the first call (NotFound)."""
        return AsyncSession(self, pb.OpenSessionResponse(session_id=session_id))

    async def close_session(self, session_id: str, *, timeout: float | None = None) -> None:
        """Closes a session; NOT_FOUND if it is unknown, closed or expired."""
        await self._unary("sessions", "CloseSession", pb.CloseSessionRequest(session_id=session_id), timeout)

    # -- typed tool RPCs --------------------------------------------------------------------

    async def read_file(
        self,
        session_id: str,
        file_path: PathLike,
        *,
        offset: int | None = None,
        limit: int | None = None,
        mode: str | int | None = None,
        indentation: Mapping[str, Any] | pb.IndentationOptions | None = None,
        timeout: float | None = None,
    ) -> pb.ReadFileResponse:
        """See :meth:`corral_client.Client.read_file`."""
        req = _core.read_file_request(
            session_id, file_path, offset=offset, limit=limit, mode=mode, indentation=indentation
        )
        return await self._unary("tools", "ReadFile", req, timeout)

    async def list_dir(
        self,
        session_id: str,
        dir_path: PathLike = ".",
        *,
        offset: int | None = None,
        limit: int | None = None,
        depth: int | None = None,
        timeout: float | None = None,
    ) -> pb.ListDirResponse:
        """See :meth:`corral_client.Client.list_dir`."""
        req = _core.list_dir_request(session_id, dir_path, offset=offset, limit=limit, depth=depth)
        return await self._unary("tools", "ListDir", req, timeout)

    async def grep_files(
        self,
        session_id: str,
        pattern: str,
        *,
        include: str = "",
        path: PathLike = "",
        limit: int | None = None,
        timeout: float | None = None,
    ) -> pb.GrepFilesResponse:
        """See :meth:`corral_client.Client.grep_files`."""
        req = _core.grep_files_request(session_id, pattern, include=include, path=path, limit=limit)
        return await self._unary("tools", "GrepFiles", req, timeout)

    async def apply_patch(
        self, session_id: str, patch: str, *, timeout: float | None = None
    ) -> pb.ApplyPatchResponse:
        """See :meth:`corral_client.Client.apply_patch`."""
        req = pb.ApplyPatchRequest(session_id=session_id, patch=patch)
        return await self._unary("tools", "ApplyPatch", req, timeout)

    async def shell(
        self,
        session_id: str,
        command: Sequence[str] | None = None,
        *,
        script: str | None = None,
        workdir: PathLike = "",
        timeout_ms: int | None = None,
        login: bool | None = None,
        with_escalated_permissions: bool = False,
        justification: str = "",
        truncation_bytes: int | None = None,
        truncation_tokens: int | None = None,
        timeout: float | None = None,
    ) -> pb.ShellResponse:
        """See :meth:`corral_client.Client.shell`."""
        req = _core.shell_request(
            session_id, command, script=script, workdir=workdir, timeout_ms=timeout_ms, login=login,
            with_escalated_permissions=with_escalated_permissions, justification=justification,
            truncation_bytes=truncation_bytes, truncation_tokens=truncation_tokens,
        )  # fmt: skip
        return await self._unary("tools", "Shell", req, timeout)

    def shell_stream(
        self,
        session_id: str,
        command: Sequence[str] | None = None,
        *,
        script: str | None = None,
        workdir: PathLike = "",
        timeout_ms: int | None = None,
        login: bool | None = None,
        with_escalated_permissions: bool = False,
        justification: str = "",
        truncation_bytes: int | None = None,
        truncation_tokens: int | None = None,
        timeout: float | None = None,
    ) -> AsyncShellStream:
        """Like :meth:`shell`, streaming: ``async for`` over the returned :class:`AsyncShellStream`."""
        req = _core.shell_request(
            session_id, command, script=script, workdir=workdir, timeout_ms=timeout_ms, login=login,
            with_escalated_permissions=with_escalated_permissions, justification=justification,
            truncation_bytes=truncation_bytes, truncation_tokens=truncation_tokens,
        )  # fmt: skip
        call = self._stubs.tools.ShellStream(
            req, timeout=self.timeout if timeout is None else timeout, metadata=self.metadata or None
        )
        return AsyncShellStream(call)

    # -- the bridge -------------------------------------------------------------------------

    async def list_tools(
        self,
        format: str | int = "responses",
        *,
        session_id: str = "",
        exclude: Sequence[str] = (),
        timeout: float | None = None,
    ) -> list[dict[str, Any]]:
        """See :meth:`corral_client.Client.list_tools`."""
        req = _core.list_tools_request(format, session_id=session_id, exclude=exclude)
        return _core.tools_list(await self._unary("bridge", "ListTools", req, timeout))

    async def invoke(
        self,
        session_id: str,
        name: str,
        arguments: str | Mapping[str, Any] | None,
        *,
        call_id: str = "",
        freeform: bool = False,
        timeout: float | None = None,
    ) -> pb.InvokeResponse:
        """See :meth:`corral_client.Client.invoke`."""
        req = _core.invoke_request(session_id, name, arguments, call_id=call_id, freeform=freeform)
        return await self._unary("bridge", "Invoke", req, timeout)

    async def get_prompt_context(
        self, session_id: str, *, project_doc_max_bytes: int | None = None, timeout: float | None = None
    ) -> pb.GetPromptContextResponse:
        """See :meth:`corral_client.Client.get_prompt_context`."""
        req = _core.prompt_context_request(session_id, project_doc_max_bytes)
        return await self._unary("bridge", "GetPromptContext", req, timeout)

    async def decide_approval(
        self,
        session_id: str,
        approval_id: str,
        decision: str | int | bool | None,
        *,
        timeout: float | None = None,
    ) -> pb.DecideApprovalResponse:
        """See :meth:`corral_client.Client.decide_approval`."""
        req = _core.decide_approval_request(session_id, approval_id, decision)
        return await self._unary("bridge", "DecideApproval", req, timeout)

    async def classify_command(self, command: Sequence[str], *, timeout: float | None = None) -> bool:
        """See :meth:`corral_client.Client.classify_command`."""
        req = pb.ClassifyCommandRequest(command=list(command))
        return (await self._unary("bridge", "ClassifyCommand", req, timeout)).known_safe


class AsyncSession(SessionBase):
    """An open session (:meth:`AsyncClient.open_session`, :meth:`AsyncClient.session`): the
    methods of :class:`corral_client.Session`, as coroutines; ``processes`` and ``files`` too.
    An async context manager: leaving the ``async with`` block closes the session."""

    client: AsyncClient

    def __init__(self, client: AsyncClient, response: pb.OpenSessionResponse):
        super().__init__(client, response)
        self.processes = AsyncProcesses(self)
        self.files = AsyncFiles(self)

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close(missing_ok=True)

    async def close(self, *, missing_ok: bool = False) -> None:
        """Closes the session. With ``missing_ok``, an already expired session is not an error."""
        if self.closed:
            return
        try:
            await self.client.close_session(self.id)
        except CorralError as e:
            self._closed_ok(e, missing_ok)
        else:
            self._closed_ok(None, missing_ok)

    async def read_file(self, file_path: PathLike, **kw: Any) -> pb.ReadFileResponse:
        return await self.client.read_file(self.id, file_path, **kw)

    async def list_dir(self, dir_path: PathLike = ".", **kw: Any) -> pb.ListDirResponse:
        return await self.client.list_dir(self.id, dir_path, **kw)

    async def grep_files(self, pattern: str, **kw: Any) -> pb.GrepFilesResponse:
        return await self.client.grep_files(self.id, pattern, **kw)

    async def apply_patch(self, patch: str, **kw: Any) -> pb.ApplyPatchResponse:
        return await self.client.apply_patch(self.id, patch, **kw)

    async def shell(self, command: Sequence[str] | None = None, **kw: Any) -> pb.ShellResponse:
        return await self.client.shell(self.id, command, **kw)

    def shell_stream(self, command: Sequence[str] | None = None, **kw: Any) -> AsyncShellStream:
        return self.client.shell_stream(self.id, command, **kw)

    async def list_tools(self, format: str | int = "responses", **kw: Any) -> list[dict[str, Any]]:
        return await self.client.list_tools(format, session_id=self.id, **kw)

    async def invoke(self, name: str, arguments: str | Mapping[str, Any] | None, **kw: Any) -> pb.InvokeResponse:
        return await self.client.invoke(self.id, name, arguments, **kw)

    async def get_prompt_context(self, **kw: Any) -> pb.GetPromptContextResponse:
        return await self.client.get_prompt_context(self.id, **kw)

    async def decide_approval(
        self, approval_id: str, decision: str | int | bool | None, **kw: Any
    ) -> pb.DecideApprovalResponse:
        return await self.client.decide_approval(self.id, approval_id, decision, **kw)

    async def set_network_rules(
        self, allow_domains: Sequence[str] = (), deny_domains: Sequence[str] = (), **kw: Any
    ) -> None:
        await self.client.set_network_rules(self.id, allow_domains, deny_domains, **kw)


class AsyncShellStream:
    """The events of a streaming shell call, for ``async for``: ``begin``, ``delta``s, ``end``
    (see :class:`corral_client.ShellStream`). :meth:`cancel` (or leaving an ``async with`` block
    early) kills the command."""

    def __init__(self, call: Any):
        self._call = call
        self.result: pb.ShellResponse | None = None

    async def __aiter__(self) -> AsyncIterator[pb.ShellStreamEvent]:
        try:
            async for event in self._call:
                result = _core.shell_event_result(event)
                if result is not None:
                    self.result = result
                yield event
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def cancel(self) -> None:
        self._call.cancel()

    async def wait(self) -> pb.ShellResponse:
        """Drains the stream and returns the final result."""
        async for _ in self:
            pass
        if self.result is None:  # pragma: no cover - the daemon always ends with `end`
            raise RuntimeError("shell stream ended without a result")
        return self.result

    async def __aenter__(self) -> AsyncShellStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.result is None:
            self.cancel()


# -- processes ------------------------------------------------------------------------------


class AsyncProcesses:
    """``session.processes``: see :class:`corral_client.processes.Processes`."""

    def __init__(self, session: AsyncSession):
        self.session = session

    async def start(
        self,
        argv: Sequence[str] | None = None,
        *,
        script: str | None = None,
        workdir: PathLike | None = None,
        tty: bool = False,
        rows: int = 0,
        cols: int = 0,
        env: Mapping[str, str] | None = None,
        escalated: bool = False,
        timeout: float | None = None,
    ) -> AsyncProcess:
        """See :meth:`corral_client.processes.Processes.start`."""
        req = start_request(
            self.session.id, argv, script=script, workdir=workdir, tty=tty, rows=rows, cols=cols,
            env=env, escalated=escalated,
        )  # fmt: skip
        resp = await self.session.client._unary("processes", "StartProcess", req, timeout)
        return AsyncProcess(self.session, resp.process_id, tty=tty)

    def attach(self, process_id: int) -> AsyncProcess:
        """A handle on a process started earlier; nothing is sent."""
        return AsyncProcess(self.session, int(process_id))

    async def list(self, *, timeout: float | None = None) -> list[ProcessInfo]:
        """The session's processes, by id."""
        req = pb.ListProcessesRequest(session_id=self.session.id)
        return process_infos(await self.session.client._unary("processes", "ListProcesses", req, timeout))


class AsyncProcess(ProcessBase):
    """A process of a session: see :class:`corral_client.processes.Process`. An async context
    manager: leaving the ``async with`` block terminates it."""

    session: AsyncSession

    async def __aenter__(self) -> AsyncProcess:
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.terminate()
        except CorralError as e:
            if e.code != grpc.StatusCode.NOT_FOUND:
                raise

    async def _call(self, method: str, request: Any, timeout: float | None) -> Any:
        return await self.session.client._unary("processes", method, request, timeout)

    async def write(self, data: bytes | str, *, close_stdin: bool = False, timeout: float | None = None) -> None:
        await self._call("WriteProcess", process_write_request(self.session.id, self.id, data, close_stdin), timeout)

    async def close_stdin(self, *, timeout: float | None = None) -> None:
        await self.write(b"", close_stdin=True, timeout=timeout)

    async def read(
        self,
        after_seq: int | Cursor | None = None,
        wait: float = 0.0,
        max_bytes: int = 0,
        *,
        timeout: float | None = None,
    ) -> ReadResult:
        req = read_request(self.session.id, self.id, after_seq, wait, max_bytes)
        t = read_timeout(self.session.client.timeout, wait, timeout)
        return read_result(await self._call("ReadProcess", req, t))

    def follow(self, after_seq: int | Cursor | None = None, wait: float = 1.0, max_bytes: int = 0) -> AsyncFollow:
        """An async iterator of the output's chunks until it closes; see :class:`AsyncFollow`."""
        return AsyncFollow(self, after_seq, wait, max_bytes)

    async def wait(self, timeout: float | None = None) -> ProcessState:
        clock = WaitClock(timeout)
        while True:
            state = (await self.read(_PAST_THE_END, wait=clock.next_wait())).state
            if clock.done(state):
                return state

    async def resize(self, rows: int, cols: int, *, timeout: float | None = None) -> None:
        await self._call("ResizeProcess", self._request(pb.ResizeProcessRequest, rows=rows, cols=cols), timeout)

    async def signal(self, sig: str | int, *, timeout: float | None = None) -> None:
        req = self._request(pb.SignalProcessRequest, signal=_signal_name(sig))
        await self._call("SignalProcess", req, timeout)

    async def terminate(self, *, timeout: float | None = None) -> ProcessState:
        resp = await self._call("TerminateProcess", self._request(pb.TerminateProcessRequest), timeout)
        return terminated_state(resp)


class AsyncFollow(FollowCore):
    """:class:`corral_client.processes.Follow` for ``async for``: the same cursor, resuming and
    gap accounting."""

    process: AsyncProcess

    def __aiter__(self) -> AsyncFollow:
        return self

    async def __anext__(self) -> OutputChunk:
        while True:
            chunk = self._next_pending()
            if chunk is not None:
                return chunk
            if self._closed:
                raise StopAsyncIteration
            self._absorb(await self.process.read(**self._read_args()))


# -- files ----------------------------------------------------------------------------------


class AsyncFiles:
    """``session.files``: see :class:`corral_client.files.Files`."""

    def __init__(self, session: AsyncSession):
        self.session = session

    async def read(self, path: PathLike, *, timeout: Optional[float] = None) -> bytes:
        req = pb.ReadBytesRequest(session_id=self.session.id, path=os.fspath(path))
        return (await self.session.client._unary("files", "ReadBytes", req, timeout)).data

    async def write(
        self,
        path: PathLike,
        data: bytes,
        *,
        mode: Optional[int] = None,
        create_parents: bool = False,
        overwrite: bool = True,
        timeout: Optional[float] = None,
    ) -> pb.WriteBytesResponse:
        req = write_request(self.session.id, path, data, mode=mode, create_parents=create_parents, overwrite=overwrite)
        return await self.session.client._unary("files", "WriteBytes", req, timeout)

    async def stat(
        self, path: PathLike, *, follow_symlinks: bool = False, timeout: Optional[float] = None
    ) -> pb.StatResponse:
        req = pb.StatRequest(session_id=self.session.id, path=os.fspath(path), follow_symlinks=follow_symlinks)
        return await self.session.client._unary("files", "Stat", req, timeout)

    async def list_directory(self, path: PathLike, *, timeout: Optional[float] = None) -> list[pb.DirectoryEntry]:
        req = pb.ListDirectoryRequest(session_id=self.session.id, path=os.fspath(path))
        return list((await self.session.client._unary("files", "ListDirectory", req, timeout)).entries)

    async def make_directory(self, path: PathLike, *, recursive: bool = False, timeout: Optional[float] = None) -> str:
        req = pb.MakeDirectoryRequest(session_id=self.session.id, path=os.fspath(path), recursive=recursive)
        return (await self.session.client._unary("files", "MakeDirectory", req, timeout)).path

    async def remove(
        self, path: PathLike, *, recursive: bool = False, force: bool = False, timeout: Optional[float] = None
    ) -> str:
        req = pb.RemoveRequest(session_id=self.session.id, path=os.fspath(path), recursive=recursive, force=force)
        return (await self.session.client._unary("files", "Remove", req, timeout)).path

    async def copy(
        self, source: PathLike, destination: PathLike, *, recursive: bool = False, timeout: Optional[float] = None
    ) -> str:
        req = pb.CopyRequest(
            session_id=self.session.id,
            source_path=os.fspath(source),
            destination_path=os.fspath(destination),
            recursive=recursive,
        )
        return (await self.session.client._unary("files", "Copy", req, timeout)).path

    async def upload(
        self,
        local_path: PathLike,
        remote_path: PathLike,
        *,
        overwrite: bool = False,
        create_parents: bool = False,
        timeout: Optional[float] = None,
    ) -> pb.TransferSummary:
        nodes, skipped = await asyncio.to_thread(plan_upload, local_path)
        stream = RequestStream(
            upload_requests(
                self.session.id, local_path, remote_path, nodes, overwrite=overwrite, create_parents=create_parents
            )
        )
        try:
            resp = await self.session.client._stream_unary("files", "Upload", _in_thread(stream), timeout)
        except (CorralError, asyncio.CancelledError):
            # grpc.aio cancels a call whose request iterator raised.
            if stream.error is not None:
                raise stream.error from None
            raise
        return upload_summary(resp, skipped)

    async def download(
        self,
        remote_path: PathLike,
        local_path: PathLike,
        *,
        overwrite: bool = False,
        timeout: Optional[float] = None,
    ) -> pb.TransferSummary:
        sink = await asyncio.to_thread(DownloadSink, remote_path, local_path, overwrite=overwrite)
        try:
            req = pb.DownloadRequest(session_id=self.session.id, path=os.fspath(remote_path))
            async for msg in self.session.client._unary_stream("files", "Download", req, timeout):
                await asyncio.to_thread(sink.feed, msg)
            return await asyncio.to_thread(sink.commit)
        finally:
            await asyncio.to_thread(sink.close)
