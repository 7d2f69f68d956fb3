"""The corral client: a channel to the daemon, sessions, the typed tool RPCs and the bridge."""

from __future__ import annotations

import json
import os
import pwd
import stat
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Union

import grpc

from ._proto import corral_pb2 as pb
from ._proto import corral_pb2_grpc as pb_grpc
from .errors import CorralError, PermissionDenied, from_rpc_error
from .processes import Processes

__all__ = ["MAX_MESSAGE_BYTES", "Client", "Session", "ShellStream", "check_socket", "default_target", "pb"]

PathLike = Union[str, "os.PathLike[str]"]

_MODES = {
    "read-only": pb.SANDBOX_MODE_READ_ONLY,
    "workspace-write": pb.SANDBOX_MODE_WORKSPACE_WRITE,
    "danger-full-access": pb.SANDBOX_MODE_DANGER_FULL_ACCESS,
}
_FORMATS = {
    "responses": pb.TOOL_FORMAT_RESPONSES,
    "chat": pb.TOOL_FORMAT_CHAT_COMPLETIONS,
    "chat-completions": pb.TOOL_FORMAT_CHAT_COMPLETIONS,
    "chat_completions": pb.TOOL_FORMAT_CHAT_COMPLETIONS,
}
_READ_MODES = {"slice": pb.READ_MODE_SLICE, "indentation": pb.READ_MODE_INDENTATION}


# The largest message either side of a call may carry: gRPC's default receive limit (4 MiB) is
# less than a big read_file answer or a full ReadProcess (up to 4 MiB of output plus framing).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

SOCKET_ENV = "CORRAL_SOCKET"
SYSTEM_SOCKET = "/run/corral/corral.sock"


def default_target() -> str:
    """The daemon to call when no target is given: the socket rule shared with ``corral``
    (``src/daemon/socket.rs``). ``$CORRAL_SOCKET``, else ``$XDG_RUNTIME_DIR/corral/corral.sock``
    when not root and a daemon is there, else the system daemon ``/run/corral/corral.sock``.
    Never a ``/tmp`` location another user could create first."""
    env = os.environ.get(SOCKET_ENV)
    if env:
        return env
    if os.geteuid() != 0:
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        if runtime:
            own = os.path.join(runtime, "corral", "corral.sock")
            if os.path.exists(own):
                return f"unix:{own}"
    return f"unix:{SYSTEM_SOCKET}"


def check_socket(path: str | os.PathLike[str], uid: int | None = None) -> None:
    """Refuses a Unix socket another user could have planted (raises :class:`PermissionDenied`):
    its directory must be owned by root or ``uid`` (default: this process's) and not writable by
    group or others, and the socket itself owned by root or ``uid``. A missing socket passes (the
    connection reports it). The same check as the ``corral`` CLI."""
    me = os.geteuid() if uid is None else uid
    path = os.fspath(path)
    try:
        sock = os.stat(path)
    except FileNotFoundError:
        return
    directory = os.path.dirname(path) or "."
    st = os.stat(directory)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, me) or mode & 0o022:
        raise PermissionDenied(
            grpc.StatusCode.PERMISSION_DENIED,
            f"refusing socket {path}: its directory {directory} is owned by {_describe_uid(st.st_uid)} "
            f"with mode {mode:04o}; a corral socket's directory must be owned by root or "
            f"{_describe_uid(me)} and not writable by group or others, or another user could put an "
            "impostor daemon there. Use a private directory (e.g. $XDG_RUNTIME_DIR/corral or /run/corral)",
        )
    if sock.st_uid not in (0, me):
        raise PermissionDenied(
            grpc.StatusCode.PERMISSION_DENIED,
            f"refusing socket {path}: it is owned by {_describe_uid(sock.st_uid)}, not by root or "
            f"{_describe_uid(me)}; it may be an impostor",
        )


def _describe_uid(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _grpc_target(target: str | os.PathLike[str] | None) -> tuple[str, bool]:
    """Maps corral's address syntax to a gRPC target; returns (target, is_unix)."""
    if target is None:
        target = default_target()
    target = os.fspath(target)
    if target.startswith("unix:"):
        path = target[len("unix:") :]
        if path.startswith("//"):  # unix:///abs/path
            path = path[2:]
        return "unix:" + os.path.abspath(path), True
    if target.startswith("tcp:"):
        return target[len("tcp:") :], False
    if (
        target.startswith(("/", "./", "../", "~"))
        or (os.sep in target and ":" not in target)
        or os.path.exists(target)
    ):
        return "unix:" + os.path.abspath(os.path.expanduser(target)), True
    return target, False  # host:port, dns:…, ipv4:…: gRPC's own syntax


def _mode(mode: str | int) -> int:
    if isinstance(mode, int):
        return mode
    key = mode.strip().lower().replace("_", "-")
    if key.startswith("sandbox-mode-"):
        key = key[len("sandbox-mode-") :]
    try:
        return _MODES[key]
    except KeyError:
        raise ValueError(f"unknown sandbox mode {mode!r}: use one of {', '.join(_MODES)}") from None


def _format(fmt: str | int) -> int:
    if isinstance(fmt, int):
        return fmt
    try:
        return _FORMATS[fmt.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown tool format {fmt!r}: use 'responses' or 'chat'") from None


def _read_file_path(value: bytes | str | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    with open(value, "rb") as f:
        return f.read()


def _arguments(arguments: str | Mapping[str, Any] | None) -> str:
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)


class Client:
    """A connection to a corral daemon.

    ``target`` is a Unix socket (``unix:/path``, or a bare path such as ``/run/corral.sock`` or
    ``./corral.sock``), ``tcp:HOST:PORT``, or any gRPC target (``HOST:PORT``, ``dns:…``); the default
    is :func:`default_target` (``$CORRAL_SOCKET``, else the per-user or the system daemon). A Unix
    socket must pass :func:`check_socket` (:class:`PermissionDenied` otherwise). For TLS pass ``tls=True`` (system roots) or
    ``root_certificates`` (and ``private_key`` + ``certificate_chain`` for a client certificate),
    as bytes or file paths, or ready-made ``credentials``.

    ``timeout`` is the default deadline in seconds of every unary call (None: no deadline).
    ``metadata`` is sent with every call (e.g. an authorization header of a proxy in front).
    Messages of up to 64 MiB (:data:`MAX_MESSAGE_BYTES`) are sent and received, instead of gRPC's
    default 4 MiB receive limit; ``options`` (gRPC channel options) may set other limits.

    Use it as a context manager, or call :meth:`close`.
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
    ):
        self.target, is_unix = _grpc_target(target)
        if is_unix:
            # Never talk to an impostor (the same rule as the corral CLI).
            check_socket(self.target[len("unix:") :])
        opts = list(options or [])
        for key in ("grpc.max_receive_message_length", "grpc.max_send_message_length"):
            if not any(k == key for k, _ in opts):
                opts.append((key, MAX_MESSAGE_BYTES))
        if is_unix and not any(k == "grpc.default_authority" for k, _ in opts):
            # gRPC C-core sends the socket path as :authority, which daemons older than the
            # patched h2 (vendor/h2) reset as malformed (RST_STREAM, PROTOCOL_ERROR); "localhost"
            # is the convention for Unix sockets.
            opts.append(("grpc.default_authority", "localhost"))
        if server_name:
            opts.append(("grpc.ssl_target_name_override", server_name))
        if credentials is None and (tls or root_certificates or private_key or certificate_chain):
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_file_path(root_certificates),
                private_key=_read_file_path(private_key),
                certificate_chain=_read_file_path(certificate_chain),
            )
        if credentials is not None:
            self._channel = grpc.secure_channel(self.target, credentials, options=opts)
        else:
            self._channel = grpc.insecure_channel(self.target, options=opts)
        self.timeout = timeout
        self.metadata = tuple(metadata or ())
        self._sessions = pb_grpc.SessionsStub(self._channel)
        self._tools = pb_grpc.ToolsStub(self._channel)
        self._bridge = pb_grpc.BridgeStub(self._channel)
        self._processes = pb_grpc.ProcessesStub(self._channel)

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def channel(self) -> grpc.Channel:
        """The underlying gRPC channel (for other services on the same daemon)."""
        return self._channel

    def _call(self, method: Any, request: Any, timeout: float | None) -> Any:
        try:
            return method(
                request,
                timeout=self.timeout if timeout is None else timeout,
                metadata=self.metadata or None,
            )
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def close(self) -> None:
        """Closes the channel (sessions stay open on the daemon until closed or expired)."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Blocks until the channel connects; raises :class:`~corral_client.Unavailable` if not."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            from .errors import Unavailable

            raise Unavailable(
                grpc.StatusCode.UNAVAILABLE, f"corral at {self.target} did not answer in {timeout}s"
            ) from None

    # -- health and sessions ----------------------------------------------------------------

    def health(self, service: str = "", *, timeout: float | None = None) -> str:
        """``grpc.health.v1`` status of the daemon or one of its services: ``"SERVING"``, …"""
        raw = service.encode()
        request = (b"\n" + _varint(len(raw)) + raw) if raw else b""
        check = self._channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        data = self._call(check, request, timeout)
        status = 0
        if data[:1] == b"\x08":
            status, _ = _read_varint(data, 1)
        return {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}.get(status, str(status))

    def capabilities(self, *, timeout: float | None = None) -> pb.GetCapabilitiesResponse:
        """Version, tools, sandbox layers and limits of the daemon."""
        return self._call(self._sessions.GetCapabilities, pb.GetCapabilitiesRequest(), timeout)

    def open_session(
        self,
        cwd: PathLike,
        mode: str | int = "read-only",
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
        timeout: float | None = None,
    ) -> Session:
        """Opens a session; use it as a context manager so it is closed on exit.

        ``cwd`` is made absolute (not resolved) on this side. ``mode`` is ``"read-only"``,
        ``"workspace-write"`` or ``"danger-full-access"`` (or a ``SandboxMode`` value). ``env`` is the
        whole environment commands get: corral passes none of its own, so give at least ``PATH``
        (and ``HOME``) for shell commands. ``shell_tool`` picks the session's shell tool
        (``"unified_exec"`` — the default, as in Codex —, ``"shell_command"``, ``"shell"`` or
        ``"none"``) and ``apply_patch_tool`` its apply_patch form (``"freeform"``, ``"function"``,
        ``"none"``); ``update_plan`` and ``view_image`` (default: offered, as in Codex) switch those
        tools off with ``False``; ``tools()`` then lists exactly that set. ``no_image_input`` says
        the model takes no images: view_image then answers Codex's refusal.
        """
        req = pb.OpenSessionRequest(
            cwd=os.path.abspath(os.fspath(cwd)),
            mode=_mode(mode),
            writable_roots=[os.fspath(r) for r in writable_roots],
            network_access=network_access,
            env=dict(env or {}),
            exclude_tmpdir_env_var=exclude_tmpdir_env_var,
            exclude_slash_tmp=exclude_slash_tmp,
        )
        if profile:
            req.profile = profile  # needs a daemon (and proto) with sandbox profiles
        if shell_tool is not None:
            req.shell_tool = _enum(pb.ShellTool, "SHELL_TOOL_", shell_tool)
        if apply_patch_tool is not None:
            req.apply_patch_tool = _enum(pb.ApplyPatchTool, "APPLY_PATCH_TOOL_", apply_patch_tool)
        if update_plan is not None:
            req.update_plan = update_plan
        if view_image is not None:
            req.view_image = view_image
        if no_image_input:
            req.no_image_input = True
        resp = self._call(self._sessions.OpenSession, req, timeout)
        return Session(self, resp)

    def session(self, session_id: str) -> Session:
        """A handle on a session opened earlier (by this or another client): nothing is sent, an
        unknown id fails on the first call (NotFound). Leaving its ``with`` block closes it."""
        return Session(self, pb.OpenSessionResponse(session_id=session_id))

    def close_session(self, session_id: str, *, timeout: float | None = None) -> None:
        """Closes a session; NOT_FOUND if it is unknown, closed or expired."""
        self._call(self._sessions.CloseSession, pb.CloseSessionRequest(session_id=session_id), timeout)

    # -- typed tool RPCs --------------------------------------------------------------------

    def read_file(
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
        """Reads a file with line numbers; ``.text`` is the model-facing text, ``.lines`` the lines.

        ``mode`` is ``"slice"`` (default) or ``"indentation"``; ``indentation`` takes the
        ``IndentationOptions`` fields (anchor_line, max_levels, include_siblings, include_header,
        max_lines) as a dict or message.
        """
        req = pb.ReadFileRequest(session_id=session_id, file_path=os.fspath(file_path))
        if offset is not None:
            req.offset = offset
        if limit is not None:
            req.limit = limit
        if mode is not None:
            req.mode = mode if isinstance(mode, int) else _READ_MODES[mode]
        if indentation is not None:
            if isinstance(indentation, pb.IndentationOptions):
                req.indentation.CopyFrom(indentation)
            else:
                req.indentation.CopyFrom(pb.IndentationOptions(**indentation))
        return self._call(self._tools.ReadFile, req, timeout)

    def list_dir(
        self,
        session_id: str,
        dir_path: PathLike = ".",
        *,
        offset: int | None = None,
        limit: int | None = None,
        depth: int | None = None,
        timeout: float | None = None,
    ) -> pb.ListDirResponse:
        """Lists a directory breadth-first; ``.entries`` are structured, ``.text`` is the model text."""
        req = pb.ListDirRequest(session_id=session_id, dir_path=os.fspath(dir_path))
        if offset is not None:
            req.offset = offset
        if limit is not None:
            req.limit = limit
        if depth is not None:
            req.depth = depth
        return self._call(self._tools.ListDir, req, timeout)

    def grep_files(
        self,
        session_id: str,
        pattern: str,
        *,
        include: str = "",
        path: PathLike = "",
        limit: int | None = None,
        timeout: float | None = None,
    ) -> pb.GrepFilesResponse:
        """Files whose contents match ``pattern``, newest first (``.matches``, ``.text``)."""
        req = pb.GrepFilesRequest(
            session_id=session_id, pattern=pattern, include=include, path=os.fspath(path)
        )
        if limit is not None:
            req.limit = limit
        return self._call(self._tools.GrepFiles, req, timeout)

    def _shell_request(
        self,
        session_id: str,
        command: Sequence[str] | None,
        script: str | None,
        workdir: PathLike,
        timeout_ms: int | None,
        login: bool | None,
        with_escalated_permissions: bool,
        justification: str,
        truncation_bytes: int | None,
        truncation_tokens: int | None,
    ) -> pb.ShellRequest:
        if isinstance(command, str):
            raise TypeError("command is an argv list; pass a shell script as script=...")
        if (command is None) == (script is None):
            raise TypeError("give exactly one of command (an argv list) and script")
        req = pb.ShellRequest(
            session_id=session_id,
            command=list(command or []),
            script=script or "",
            workdir=os.fspath(workdir),
            with_escalated_permissions=with_escalated_permissions,
            justification=justification,
        )
        if timeout_ms is not None:
            req.timeout_ms = timeout_ms
        if login is not None:
            req.login = login
        if truncation_bytes is not None and truncation_tokens is not None:
            raise TypeError("give at most one of truncation_bytes and truncation_tokens")
        if truncation_bytes is not None:
            req.truncation.bytes = truncation_bytes
        if truncation_tokens is not None:
            req.truncation.tokens = truncation_tokens
        return req

    def shell(
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
        """Runs ``command`` (an argv list) or ``script`` (run by the user's shell) in the sandbox.

        A non-zero exit is data (``.exit_code``, ``.success``), not an error. ``timeout_ms`` is the
        command's own timeout; ``timeout`` the RPC deadline.
        """
        req = self._shell_request(
            session_id, command, script, workdir, timeout_ms, login,
            with_escalated_permissions, justification, truncation_bytes, truncation_tokens,
        )  # fmt: skip
        return self._call(self._tools.Shell, req, timeout)

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
    ) -> ShellStream:
        """Like :meth:`shell`, streaming: iterate the returned :class:`ShellStream` for events."""
        req = self._shell_request(
            session_id, command, script, workdir, timeout_ms, login,
            with_escalated_permissions, justification, truncation_bytes, truncation_tokens,
        )  # fmt: skip
        try:
            call = self._tools.ShellStream(
                req,
                timeout=self.timeout if timeout is None else timeout,
                metadata=self.metadata or None,
            )
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return ShellStream(call)

    # -- the bridge -------------------------------------------------------------------------

    def list_tools(
        self,
        format: str | int = "responses",
        *,
        session_id: str = "",
        exclude: Sequence[str] = (),
        timeout: float | None = None,
    ) -> list[dict[str, Any]]:
        """The model-facing tool definitions (parsed JSON), ready for the API request's ``tools``.

        ``format`` is ``"responses"`` (OpenAI Responses API, with the freeform ``apply_patch``) or
        ``"chat"`` (Chat Completions).
        """
        req = pb.ListToolsRequest(format=_format(format), session_id=session_id, exclude=list(exclude))
        resp = self._call(self._bridge.ListTools, req, timeout)
        return json.loads(resp.tools_json)

    def invoke(
        self,
        session_id: str,
        name: str,
        arguments: str | Mapping[str, Any] | None,
        *,
        call_id: str = "",
        freeform: bool = False,
        timeout: float | None = None,
    ) -> pb.InvokeResponse:
        """Runs one model tool call; returns ``{call_id, output, success}`` as Codex would.

        ``arguments`` is the call's JSON string (a dict is serialised compactly), or for a
        freeform (custom tool) call with ``freeform=True`` the raw input. Tool failures come back
        as model text with ``success=False``; only session, transport and sandbox-setup failures
        raise.
        """
        req = pb.InvokeRequest(
            session_id=session_id,
            name=name,
            arguments=arguments if freeform and isinstance(arguments, str) else _arguments(arguments),
            call_id=call_id,
            freeform=freeform,
        )
        return self._call(self._bridge.Invoke, req, timeout)


class Session:
    """An open session: the typed RPCs, the bridge and its processes, bound to its id.

    A context manager: leaving the ``with`` block closes the session.
    """

    def __init__(self, client: Client, response: pb.OpenSessionResponse):
        self.client = client
        self.id: str = response.session_id
        self.writable_roots: list[str] = list(response.writable_roots)
        self.skipped_writable_roots: list[str] = list(response.skipped_writable_roots)
        self.closed = False
        #: The session's long-lived processes (:class:`~corral_client.processes.Processes`).
        self.processes = Processes(self)

    def __repr__(self) -> str:
        return f"Session(id={self.id!r}, closed={self.closed})"

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(missing_ok=True)

    def close(self, *, missing_ok: bool = False) -> None:
        """Closes the session. With ``missing_ok``, an already expired session is not an error."""
        if self.closed:
            return
        try:
            self.client.close_session(self.id)
        except CorralError as e:
            if not (missing_ok and e.code == grpc.StatusCode.NOT_FOUND):
                raise
        self.closed = True

    def read_file(self, file_path: PathLike, **kw: Any) -> pb.ReadFileResponse:
        """See :meth:`Client.read_file`."""
        return self.client.read_file(self.id, file_path, **kw)

    def list_dir(self, dir_path: PathLike = ".", **kw: Any) -> pb.ListDirResponse:
        """See :meth:`Client.list_dir`."""
        return self.client.list_dir(self.id, dir_path, **kw)

    def grep_files(self, pattern: str, **kw: Any) -> pb.GrepFilesResponse:
        """See :meth:`Client.grep_files`."""
        return self.client.grep_files(self.id, pattern, **kw)

    def shell(self, command: Sequence[str] | None = None, **kw: Any) -> pb.ShellResponse:
        """See :meth:`Client.shell`."""
        return self.client.shell(self.id, command, **kw)

    def shell_stream(self, command: Sequence[str] | None = None, **kw: Any) -> ShellStream:
        """See :meth:`Client.shell_stream`."""
        return self.client.shell_stream(self.id, command, **kw)

    def list_tools(self, format: str | int = "responses", **kw: Any) -> list[dict[str, Any]]:
        """The tool definitions this session's settings select. See :meth:`Client.list_tools`."""
        return self.client.list_tools(format, session_id=self.id, **kw)

    def invoke(self, name: str, arguments: str | Mapping[str, Any] | None, **kw: Any) -> pb.InvokeResponse:
        """See :meth:`Client.invoke`."""
        return self.client.invoke(self.id, name, arguments, **kw)


class ShellStream:
    """The events of a streaming shell call: ``begin``, then ``delta``s, then ``end``.

    Iterate it for :class:`ShellStreamEvent` messages (``event.WhichOneof("event")`` is
    ``"begin"``, ``"delta"`` or ``"end"``). After the ``end`` event :attr:`result` holds the
    :class:`ShellResponse`. :meth:`cancel` (or leaving a ``with`` block early) cancels the call,
    which kills the command's process tree.
    """

    def __init__(self, call: Any):
        self._call = call
        self.result: pb.ShellResponse | None = None

    def __iter__(self) -> Iterator[pb.ShellStreamEvent]:
        try:
            for event in self._call:
                if event.WhichOneof("event") == "end":
                    self.result = event.end
                yield event
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def cancel(self) -> None:
        self._call.cancel()

    def wait(self) -> pb.ShellResponse:
        """Drains the stream and returns the final result."""
        for _ in self:
            pass
        if self.result is None:  # pragma: no cover - the daemon always ends with `end`
            raise RuntimeError("shell stream ended without a result")
        return self.result

    def __enter__(self) -> ShellStream:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.result is None:
            self.cancel()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while pos < len(data):
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
    return result, pos


def _enum(enum: Any, prefix: str, value: str | int) -> int:
    """An enum value from its short name (``"shell_command"``), full name or number."""
    if isinstance(value, int):
        return value
    name = value if value.startswith(prefix) else prefix + value.upper().replace("-", "_")
    try:
        return enum.Value(name)
    except ValueError:
        known = ", ".join(n[len(prefix):].lower() for n in enum.keys() if not n.endswith("UNSPECIFIED"))
        raise ValueError(f"unknown {prefix.rstrip('_').lower()}: {value!r} (one of {known})") from None
