"""The corral client: a channel to the daemon, sessions, the typed tool RPCs and the bridge.

The blocking API; :mod:`corral_client.aio` is the same on ``asyncio``. Requests and answers are
built and shaped in :mod:`corral_client._core`, shared by both.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import grpc

from . import _core
from ._core import (
    DEFAULT_MODE,
    MAX_MESSAGE_BYTES,
    PathLike,
    check_socket,
    default_target,
)
from ._core import grpc_target as _grpc_target  # noqa: F401  (tests and older imports)
from ._proto import corral_pb2 as pb
from .errors import CorralError, Unavailable, from_rpc_error
from .files import Files
from .processes import Processes

__all__ = ["MAX_MESSAGE_BYTES", "Client", "Session", "ShellStream", "check_socket", "default_target", "pb"]


class Client:
    """A connection to a corral daemon.

    ``target`` is a Unix socket (``unix:/path``, or a bare path such as ``/run/corral.sock`` or
    ``./corral.sock``), ``tcp:HOST:PORT``, or any gRPC target (``HOST:PORT``, ``dns:…``); the default
    is :func:`default_target` (``$CORRAL_SOCKET``, else the per-user or the system daemon). A Unix
    socket must pass :func:`check_socket` (:class:`PermissionDenied` otherwise). For TLS pass ``tls=True`` (system roots) or
    ``root_certificates`` (and ``private_key`` + ``certificate_chain`` for a client certificate),
    as bytes or file paths, or ready-made ``credentials``.

    ``token`` is a bearer token the daemon maps to a local user (its ``[[tokens]]``), sent as
    ``authorization: Bearer TOKEN`` on every call; without it, ``$CORRAL_TOKEN``. As for the
    ``corral`` CLI: for TCP targets only (``$CORRAL_TOKEN`` is ignored for a Unix socket, an explicit
    token there raises :class:`InvalidArgument`) and only over TLS (a token over plain TCP raises
    :class:`InvalidArgument`, wherever it came from).

    A Unix socket that is missing or refuses connections is :class:`Unavailable` saying which.

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
            self._channel = grpc.secure_channel(self.target, credentials, options=opts)
        else:
            self._channel = grpc.insecure_channel(self.target, options=opts)
        self.timeout = timeout
        self.metadata = tuple(metadata or ())
        self._stubs = _core.Stubs(self._channel)

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def channel(self) -> grpc.Channel:
        """The underlying gRPC channel (for other services on the same daemon)."""
        return self._channel

    def _kw(self, timeout: float | None) -> dict[str, Any]:
        return {"timeout": self.timeout if timeout is None else timeout, "metadata": self.metadata or None}

    def _unary(self, service: str, method: str, request: Any, timeout: float | None) -> Any:
        """One unary call of ``service`` (an attribute of :class:`~corral_client._core.Stubs`)."""
        try:
            return getattr(getattr(self._stubs, service), method)(request, **self._kw(timeout))
        except grpc.RpcError as e:
            raise _core.explain(self.target, from_rpc_error(e)) from None

    def _unary_stream(self, service: str, method: str, request: Any, timeout: float | None) -> Iterator[Any]:
        """The answers of a server-streaming call; its deadline is ``timeout`` only (a stream
        may last longer than the client's default deadline of a unary call)."""
        call = getattr(getattr(self._stubs, service), method)(
            request, timeout=timeout, metadata=self.metadata or None
        )
        try:
            yield from call
        except grpc.RpcError as e:
            raise _core.explain(self.target, from_rpc_error(e)) from None
        finally:
            call.cancel()  # a no-op once the call is over; stops it when the caller stops early

    def _stream_unary(self, service: str, method: str, requests: Iterable[Any], timeout: float | None) -> Any:
        """A client-streaming call; its deadline is ``timeout`` only (like :meth:`_unary_stream`)."""
        try:
            return getattr(getattr(self._stubs, service), method)(
                iter(requests), timeout=timeout, metadata=self.metadata or None
            )
        except grpc.RpcError as e:
            raise _core.explain(self.target, from_rpc_error(e)) from None

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
            raise _core.explain(
                self.target,
                Unavailable(grpc.StatusCode.UNAVAILABLE, f"corral at {self.target} did not answer in {timeout}s"),
            ) from None

    # -- health and sessions ----------------------------------------------------------------

    def health(self, service: str = "", *, timeout: float | None = None) -> str:
        """``grpc.health.v1`` status of the daemon or one of its services: ``"SERVING"``, …"""
        return _core.health_status(self._unary("health", "Check", _core.health_request(service), timeout))

    def capabilities(self, *, timeout: float | None = None) -> pb.GetCapabilitiesResponse:
        """Version, tools, sandbox layers and limits of the daemon."""
        return self._unary("sessions", "GetCapabilities", pb.GetCapabilitiesRequest(), timeout)

    def open_session(
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
    ) -> Session:
        """Opens a session; use it as a context manager so it is closed on exit.

        ``cwd`` (default: the current directory) is made absolute (not resolved) on this side.
        ``mode`` is ``"read-only"`` (the default), ``"workspace-write"`` or
        ``"danger-full-access"`` (or a ``SandboxMode`` value). ``env`` is the whole environment
        commands get: corral passes none of its own, so give at least ``PATH`` (and ``HOME``) for
        shell commands. ``shell_tool`` picks the session's shell tool (``"unified_exec"`` — the
        default, as in Codex —, ``"shell_command"``, ``"shell"`` or ``"none"``) and
        ``apply_patch_tool`` its apply_patch form (``"freeform"``, ``"function"``, ``"none"``);
        ``update_plan`` and ``view_image`` (default: offered, as in Codex) switch those tools off
        with ``False``; ``tools()`` then lists exactly that set. ``no_image_input`` says the model
        takes no images: view_image then answers Codex's refusal.
        ``background_terminal_max_timeout_ms`` is the longest an empty ``write_stdin`` poll waits
        (0 or unset: Codex's 300 000). ``approval_policy`` (``"untrusted"``, ``"on-failure"``,
        ``"on-request"``, ``"never"``; unset: nothing is asked) makes some command calls come back
        with an ``approval`` request instead of a result (see :meth:`decide_approval`); a request
        waits ``approval_timeout_ms`` (default ten minutes).

        ``network`` is how commands reach the network: ``"off"``, ``"on"`` (read-only and
        workspace-write; danger-full-access always has it) or ``"proxy"`` (or a ``NetworkMode``
        value); unset, ``network_access`` decides, as before (on, or off). A ``"proxy"`` session's
        commands reach only the hosts ``allow_domains`` names, through corral's egress proxy
        (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY`` are set for them): ``"example.com"``
        exactly, ``"*.example.com"`` its subdomains, either with ``":PORT"`` or
        ``":PORT,PORT"``; ``deny_domains`` are refused even when an allow rule matches.
        :meth:`set_network_rules` replaces the rules later. The daemon judges the combination:
        ``network_access=True`` with ``"off"`` or ``"proxy"``, rules without ``"proxy"``, a
        malformed rule or ``"proxy"`` in danger-full-access raise :class:`InvalidArgument`, whose
        ``field_violations`` name the field (``network_mode``, ``allow_domains[1]``, …).
        """
        req = _core.open_session_request(
            cwd, mode, writable_roots=writable_roots, network_access=network_access, env=env,
            exclude_tmpdir_env_var=exclude_tmpdir_env_var, exclude_slash_tmp=exclude_slash_tmp,
            profile=profile, shell_tool=shell_tool, apply_patch_tool=apply_patch_tool,
            update_plan=update_plan, view_image=view_image, no_image_input=no_image_input,
            background_terminal_max_timeout_ms=background_terminal_max_timeout_ms,
            approval_policy=approval_policy, approval_timeout_ms=approval_timeout_ms,
            network=network, allow_domains=allow_domains, deny_domains=deny_domains,
        )  # fmt: skip
        return Session(self, self._unary("sessions", "OpenSession", req, timeout))

    def set_network_rules(
        self,
        session_id: str,
        allow_domains: Sequence[str] = (),
        deny_domains: Sequence[str] = (),
        *,
        timeout: float | None = None,
    ) -> None:
        """Replaces a ``network="proxy"`` session's allow and deny rules (the same syntax as
        :meth:`open_session`'s; none allowed: nothing is reachable). New connections follow them;
        one already open keeps what let it in. A session of another network mode is
        :class:`FailedPrecondition`; a malformed rule :class:`InvalidArgument`, its
        ``field_violations`` naming it (``allow_domains[0]``), and the rules stay as they were."""
        req = _core.set_network_rules_request(session_id, allow_domains, deny_domains)
        self._unary("sessions", "SetNetworkRules", req, timeout)

    def session(self, session_id: str) -> Session:
        """Attaches to a session opened earlier (by this or another client, e.g. another
        program): nothing is sent, an unknown id fails on the first call (NotFound). Leaving its
        ``with`` block closes it."""
        return Session(self, pb.OpenSessionResponse(session_id=session_id))

    def close_session(self, session_id: str, *, timeout: float | None = None) -> None:
        """Closes a session; NOT_FOUND if it is unknown, closed or expired."""
        self._unary("sessions", "CloseSession", pb.CloseSessionRequest(session_id=session_id), timeout)

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
        req = _core.read_file_request(
            session_id, file_path, offset=offset, limit=limit, mode=mode, indentation=indentation
        )
        return self._unary("tools", "ReadFile", req, timeout)

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
        req = _core.list_dir_request(session_id, dir_path, offset=offset, limit=limit, depth=depth)
        return self._unary("tools", "ListDir", req, timeout)

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
        req = _core.grep_files_request(session_id, pattern, include=include, path=path, limit=limit)
        return self._unary("tools", "GrepFiles", req, timeout)

    def apply_patch(self, session_id: str, patch: str, *, timeout: float | None = None) -> pb.ApplyPatchResponse:
        """Applies a patch (``*** Begin Patch`` … ``*** End Patch``) in the sandbox: ``.changes``
        per hunk, ``.text`` as Codex returns it."""
        return self._unary("tools", "ApplyPatch", pb.ApplyPatchRequest(session_id=session_id, patch=patch), timeout)

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
        req = _core.shell_request(
            session_id, command, script=script, workdir=workdir, timeout_ms=timeout_ms, login=login,
            with_escalated_permissions=with_escalated_permissions, justification=justification,
            truncation_bytes=truncation_bytes, truncation_tokens=truncation_tokens,
        )  # fmt: skip
        return self._unary("tools", "Shell", req, timeout)

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
        req = _core.shell_request(
            session_id, command, script=script, workdir=workdir, timeout_ms=timeout_ms, login=login,
            with_escalated_permissions=with_escalated_permissions, justification=justification,
            truncation_bytes=truncation_bytes, truncation_tokens=truncation_tokens,
        )  # fmt: skip
        try:
            call = self._stubs.tools.ShellStream(req, **self._kw(timeout))
        except grpc.RpcError as e:
            raise _core.explain(self.target, from_rpc_error(e)) from None
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
        req = _core.list_tools_request(format, session_id=session_id, exclude=exclude)
        return _core.tools_list(self._unary("bridge", "ListTools", req, timeout))

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
        req = _core.invoke_request(session_id, name, arguments, call_id=call_id, freeform=freeform)
        return self._unary("bridge", "Invoke", req, timeout)

    def get_prompt_context(
        self, session_id: str, *, project_doc_max_bytes: int | None = None, timeout: float | None = None
    ) -> pb.GetPromptContextResponse:
        """What Codex puts at the start of a conversation for this session: the environment
        context and the AGENTS.md instructions found from the repository root down to the cwd
        (``.responses_input_json`` / ``.chat_messages_json`` are those messages ready to send;
        the adapters' ``start()`` puts them first). ``project_doc_max_bytes`` overrides the
        session's budget for project docs (0: none)."""
        req = _core.prompt_context_request(session_id, project_doc_max_bytes)
        return self._unary("bridge", "GetPromptContext", req, timeout)

    def decide_approval(
        self,
        session_id: str,
        approval_id: str,
        decision: str | int | bool | None,
        *,
        timeout: float | None = None,
    ) -> pb.DecideApprovalResponse:
        """Answers an approval request (an ``approval`` on an Invoke, Shell or StartProcess
        answer) with ``"approved"``, ``"approved_for_session"`` or ``"denied"``; returns the
        completed call (``.invoke``, ``.shell`` or ``.start_process``), which may carry a new
        request. Unknown id: :class:`NotFound`; decided already: :class:`FailedPrecondition`;
        expired: :class:`DeadlineExceeded` (give the model the request's ``rejected_output``)."""
        req = _core.decide_approval_request(session_id, approval_id, decision)
        return self._unary("bridge", "DecideApproval", req, timeout)

    def classify_command(self, command: Sequence[str], *, timeout: float | None = None) -> bool:
        """Whether ``untrusted`` would run this argv without asking (it is known safe)."""
        req = pb.ClassifyCommandRequest(command=list(command))
        return self._unary("bridge", "ClassifyCommand", req, timeout).known_safe


class SessionBase:
    """What a session handle is, sync (:class:`Session`) or async (``corral_client.aio``)."""

    def __init__(self, client: Any, response: pb.OpenSessionResponse):
        self.client = client
        self.id: str = response.session_id
        self.writable_roots: list[str] = list(response.writable_roots)
        self.skipped_writable_roots: list[str] = list(response.skipped_writable_roots)
        self.closed = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, closed={self.closed})"

    def _closed_ok(self, error: CorralError | None, missing_ok: bool) -> None:
        """After a CloseSession: marks the session closed, or re-raises what failed."""
        if error is not None and not (missing_ok and error.code == grpc.StatusCode.NOT_FOUND):
            raise error
        self.closed = True


class Session(SessionBase):
    """An open session: the typed RPCs, the bridge, its processes and files, bound to its id.

    A context manager: leaving the ``with`` block closes the session.
    """

    client: Client

    def __init__(self, client: Client, response: pb.OpenSessionResponse):
        super().__init__(client, response)
        #: The session's long-lived processes (:class:`~corral_client.processes.Processes`).
        self.processes = Processes(self)
        #: Byte-exact file transfer (:class:`~corral_client.files.Files`).
        self.files = Files(self)

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
            self._closed_ok(e, missing_ok)
        else:
            self._closed_ok(None, missing_ok)

    def read_file(self, file_path: PathLike, **kw: Any) -> pb.ReadFileResponse:
        """See :meth:`Client.read_file`."""
        return self.client.read_file(self.id, file_path, **kw)

    def list_dir(self, dir_path: PathLike = ".", **kw: Any) -> pb.ListDirResponse:
        """See :meth:`Client.list_dir`."""
        return self.client.list_dir(self.id, dir_path, **kw)

    def grep_files(self, pattern: str, **kw: Any) -> pb.GrepFilesResponse:
        """See :meth:`Client.grep_files`."""
        return self.client.grep_files(self.id, pattern, **kw)

    def apply_patch(self, patch: str, **kw: Any) -> pb.ApplyPatchResponse:
        """See :meth:`Client.apply_patch`."""
        return self.client.apply_patch(self.id, patch, **kw)

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

    def get_prompt_context(self, **kw: Any) -> pb.GetPromptContextResponse:
        """See :meth:`Client.get_prompt_context`."""
        return self.client.get_prompt_context(self.id, **kw)

    def decide_approval(self, approval_id: str, decision: str | int | bool | None, **kw: Any) -> pb.DecideApprovalResponse:
        """See :meth:`Client.decide_approval`."""
        return self.client.decide_approval(self.id, approval_id, decision, **kw)

    def set_network_rules(
        self, allow_domains: Sequence[str] = (), deny_domains: Sequence[str] = (), **kw: Any
    ) -> None:
        """See :meth:`Client.set_network_rules`."""
        self.client.set_network_rules(self.id, allow_domains, deny_domains, **kw)


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
                result = _core.shell_event_result(event)
                if result is not None:
                    self.result = result
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
