"""What the sync client (:mod:`corral_client.client`) and the async one (:mod:`corral_client.aio`)
share: addresses and the socket rule, channel settings, every request built from its arguments
and every answer shaped for the caller. Only the call mechanics (a blocking call or an awaited
one) live in the two clients.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import stat
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any, Union

import grpc

from ._proto import corral_pb2 as pb
from ._proto import corral_pb2_grpc as pb_grpc
from .errors import CorralError, InvalidArgument, PermissionDenied, Unavailable

PathLike = Union[str, "os.PathLike[str]"]

# The largest message either side of a call may carry: gRPC's default receive limit (4 MiB) is
# less than a big read_file answer or a full ReadProcess (up to 4 MiB of output plus framing).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

SOCKET_ENV = "CORRAL_SOCKET"
SYSTEM_SOCKET = "/run/corral/corral.sock"
# Where the bearer token comes from when no token= is given, as for the corral CLI.
TOKEN_ENV = "CORRAL_TOKEN"

# The sandbox mode of a session opened without one: the safe one, the same in both clients.
DEFAULT_MODE = "read-only"

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

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_HEALTH_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


# -- addresses ------------------------------------------------------------------------------


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
    # The directory named, and the one the socket really lives in (a symlink in a private
    # directory may lead to a socket in a shared one, where another user can replace it).
    for directory in (os.path.dirname(path) or ".", os.path.dirname(os.path.realpath(path))):
        st = os.stat(directory)
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in (0, me) or mode & 0o022:
            raise PermissionDenied(
                grpc.StatusCode.PERMISSION_DENIED,
                f"refusing socket {path}: its directory {directory} is owned by "
                f"{_describe_uid(st.st_uid)} with mode {mode:04o}; a corral socket's directory must "
                f"be owned by root or {_describe_uid(me)} and not writable by group or others, or "
                "another user could put an impostor daemon there. Use a private directory (e.g. "
                "$XDG_RUNTIME_DIR/corral or /run/corral)",
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


def grpc_target(target: str | os.PathLike[str] | None) -> tuple[str, bool]:
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


def _read_file_path(value: bytes | str | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    with open(value, "rb") as f:
        return f.read()


def _invalid(message: str) -> InvalidArgument:
    return InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT, message)


def bearer_token(token: str | None, *, target: str, is_unix: bool, secure: bool) -> str | None:
    """The token to send, by the ``corral`` CLI's rule (``src/client/cli.rs``, ``connect.rs``):
    ``token`` if given, else ``$CORRAL_TOKEN``, for TCP targets only (``$CORRAL_TOKEN`` is ignored
    for a Unix socket, where the kernel says who calls; an explicit token there is an error), and
    only over TLS (a token over plain TCP is an error, wherever it came from)."""
    if token and is_unix:
        raise _invalid(
            f"token= is for TCP targets (tcp:HOST:PORT); {target} is a Unix socket, where the kernel says who you are"
        )
    if not token and not is_unix:
        token = os.environ.get(TOKEN_ENV) or None
    if not token:
        return None
    if not secure:
        raise _invalid(
            f"a token (token= or ${TOKEN_ENV}) is only sent over TLS, and {target} is plain TCP: pass "
            "root_certificates= (the CA that signed the daemon's certificate) or tls=True"
        )
    if not all(" " <= c <= "~" for c in token):
        raise _invalid(f"the token (token= or ${TOKEN_ENV}) has characters a header cannot carry")
    return token


def channel_settings(
    target: str | os.PathLike[str] | None,
    *,
    tls: bool,
    root_certificates: bytes | str | None,
    private_key: bytes | str | None,
    certificate_chain: bytes | str | None,
    credentials: grpc.ChannelCredentials | None,
    server_name: str | None,
    options: Sequence[tuple[str, Any]] | None,
    token: str | None = None,
) -> tuple[str, grpc.ChannelCredentials | None, list[tuple[str, Any]]]:
    """The gRPC target, credentials (None: insecure) and channel options of a client. A bearer
    token (:func:`bearer_token`) rides on the credentials as ``authorization: Bearer TOKEN``."""
    shown = os.fspath(target) if target is not None else default_target()
    target, is_unix = grpc_target(target)
    if is_unix:
        # Never talk to an impostor (the same rule as the corral CLI).
        check_socket(target[len("unix:") :])
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
    token = bearer_token(token, target=shown, is_unix=is_unix, secure=credentials is not None)
    if token is not None and credentials is not None:
        credentials = grpc.composite_channel_credentials(credentials, grpc.access_token_call_credentials(token))
    return target, credentials, opts


def unix_unreachable(target: str) -> str | None:
    """Why the Unix socket of ``target`` (``unix:/path``) takes no connection — missing, refused,
    … — in a sentence, or None when it does (or ``target`` is not a Unix socket)."""
    if not target.startswith("unix:"):
        return None
    path = target[len("unix:") :]
    hint = "is `corral serve` running? It prints the socket it listens on: pass that address or set $CORRAL_SOCKET"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(path)
    except FileNotFoundError:
        return f"cannot connect to {path}: no such socket ({hint})"
    except ConnectionRefusedError:
        return (
            f"cannot connect to {path}: connection refused, nothing is listening there (a socket left "
            f"behind by a daemon that is gone?); {hint}"
        )
    except OSError as e:
        return f"cannot connect to {path}: {e.strerror or e} ({hint})"
    finally:
        s.close()
    return None


def explain(target: str, error: CorralError) -> CorralError:
    """``error``, or for an UNAVAILABLE Unix socket that is missing or refuses connections, the
    same error saying which (gRPC's own text says only ``failed to connect to all addresses``)."""
    if isinstance(error, Unavailable):
        why = unix_unreachable(target)
        if why:
            return Unavailable(error.code, why, error.details)
    return error


class Stubs:
    """The corral.v1 service stubs on one channel (a ``grpc`` or a ``grpc.aio`` one)."""

    def __init__(self, channel: Any):
        self.sessions = pb_grpc.SessionsStub(channel)
        self.tools = pb_grpc.ToolsStub(channel)
        self.bridge = pb_grpc.BridgeStub(channel)
        self.processes = pb_grpc.ProcessesStub(channel)
        self.files = pb_grpc.FilesStub(channel)
        # grpc.health.v1 without its generated module (grpcio-health-checking is not a
        # dependency): the request and the answer are one field each, encoded by hand below.
        self.health = SimpleNamespace(
            Check=channel.unary_unary(HEALTH_CHECK, request_serializer=bytes, response_deserializer=bytes)
        )


def health_request(service: str) -> bytes:
    """A ``HealthCheckRequest{service}``."""
    raw = service.encode()
    return (b"\n" + _varint(len(raw)) + raw) if raw else b""


def health_status(data: bytes) -> str:
    """A ``HealthCheckResponse``'s status by name: ``"SERVING"``, …"""
    status = 0
    if data[:1] == b"\x08":
        status, _ = _read_varint(data, 1)
    return _HEALTH_STATUS.get(status, str(status))


# -- requests -------------------------------------------------------------------------------


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


def _enum(enum: Any, prefix: str, value: str | int) -> int:
    """An enum value from its short name (``"shell_command"``), full name or number."""
    if isinstance(value, int):
        return value
    name = value if value.startswith(prefix) else prefix + value.upper().replace("-", "_")
    try:
        return enum.Value(name)
    except ValueError:
        known = ", ".join(n[len(prefix) :].lower() for n in enum.keys() if not n.endswith("UNSPECIFIED"))
        raise ValueError(f"unknown {prefix.rstrip('_').lower()}: {value!r} (one of {known})") from None


def _arguments(arguments: str | Mapping[str, Any] | None) -> str:
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)


def open_session_request(
    cwd: PathLike | None,
    mode: str | int,
    *,
    writable_roots: Sequence[PathLike],
    network_access: bool,
    env: Mapping[str, str] | None,
    exclude_tmpdir_env_var: bool,
    exclude_slash_tmp: bool,
    profile: str | None,
    shell_tool: str | int | None,
    apply_patch_tool: str | int | None,
    update_plan: bool | None,
    view_image: bool | None,
    no_image_input: bool,
    background_terminal_max_timeout_ms: int | None,
    approval_policy: str | int | None = None,
    approval_timeout_ms: int | None = None,
    network: str | int | None = None,
    allow_domains: Sequence[str] = (),
    deny_domains: Sequence[str] = (),
) -> pb.OpenSessionRequest:
    req = pb.OpenSessionRequest(
        cwd=os.path.abspath(os.getcwd() if cwd is None else os.fspath(cwd)),
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
    if background_terminal_max_timeout_ms is not None:
        req.background_terminal_max_timeout_ms = background_terminal_max_timeout_ms
    if approval_policy is not None:
        req.approval_policy = _enum(pb.ApprovalPolicy, "APPROVAL_POLICY_", approval_policy)
    if approval_timeout_ms is not None:
        req.approval_timeout_ms = approval_timeout_ms
    # The network mode and the proxy's rules go as given: the daemon alone judges them (a
    # contradiction such as network_access=True with "proxy" or "off", rules without "proxy", a
    # malformed rule), refusing with InvalidArgument naming the field, as for the CLI.
    if network is not None:
        req.network_mode = _enum(pb.NetworkMode, "NETWORK_MODE_", network)
    req.allow_domains.extend(_rules("allow_domains", allow_domains))
    req.deny_domains.extend(_rules("deny_domains", deny_domains))
    return req


def _rules(what: str, rules: Sequence[str]) -> list[str]:
    """Domain rules as a list; a lone string (``"example.com"``, which would otherwise go as its
    characters) is a TypeError."""
    if isinstance(rules, (str, bytes)):
        raise TypeError(f"{what} is a list of rules, e.g. [{rules!r}], not a string")
    return list(rules)


def set_network_rules_request(
    session_id: str, allow_domains: Sequence[str], deny_domains: Sequence[str]
) -> pb.SetNetworkRulesRequest:
    return pb.SetNetworkRulesRequest(
        session_id=session_id,
        allow_domains=_rules("allow_domains", allow_domains),
        deny_domains=_rules("deny_domains", deny_domains),
    )


def read_file_request(
    session_id: str,
    file_path: PathLike,
    *,
    offset: int | None,
    limit: int | None,
    mode: str | int | None,
    indentation: Mapping[str, Any] | pb.IndentationOptions | None,
) -> pb.ReadFileRequest:
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
    return req


def list_dir_request(
    session_id: str, dir_path: PathLike, *, offset: int | None, limit: int | None, depth: int | None
) -> pb.ListDirRequest:
    req = pb.ListDirRequest(session_id=session_id, dir_path=os.fspath(dir_path))
    if offset is not None:
        req.offset = offset
    if limit is not None:
        req.limit = limit
    if depth is not None:
        req.depth = depth
    return req


def grep_files_request(
    session_id: str, pattern: str, *, include: str, path: PathLike, limit: int | None
) -> pb.GrepFilesRequest:
    req = pb.GrepFilesRequest(session_id=session_id, pattern=pattern, include=include, path=os.fspath(path))
    if limit is not None:
        req.limit = limit
    return req


def shell_request(
    session_id: str,
    command: Sequence[str] | None,
    *,
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


def list_tools_request(format: str | int, *, session_id: str, exclude: Sequence[str]) -> pb.ListToolsRequest:
    return pb.ListToolsRequest(format=_format(format), session_id=session_id, exclude=list(exclude))


def tools_list(resp: pb.ListToolsResponse) -> list[dict[str, Any]]:
    return json.loads(resp.tools_json)


def invoke_request(
    session_id: str, name: str, arguments: str | Mapping[str, Any] | None, *, call_id: str, freeform: bool
) -> pb.InvokeRequest:
    return pb.InvokeRequest(
        session_id=session_id,
        name=name,
        arguments=arguments if freeform and isinstance(arguments, str) else _arguments(arguments),
        call_id=call_id,
        freeform=freeform,
    )


def prompt_context_request(session_id: str, project_doc_max_bytes: int | None) -> pb.GetPromptContextRequest:
    req = pb.GetPromptContextRequest(session_id=session_id)
    if project_doc_max_bytes is not None:
        req.project_doc_max_bytes = project_doc_max_bytes
    return req


def decision_value(decision: str | int | bool | None) -> int:
    """An ``ApprovalDecision`` from ``"approved"``, ``"approved_for_session"``, ``"denied"``
    (or the enum's full name or number); ``True`` approves once, ``False``/``None`` deny."""
    if decision is True:
        return pb.APPROVAL_DECISION_APPROVED
    if decision is False or decision is None:
        return pb.APPROVAL_DECISION_DENIED
    return _enum(pb.ApprovalDecision, "APPROVAL_DECISION_", decision)


def decide_approval_request(
    session_id: str, approval_id: str, decision: str | int | bool | None
) -> pb.DecideApprovalRequest:
    return pb.DecideApprovalRequest(
        session_id=session_id, approval_id=approval_id, decision=decision_value(decision)
    )


def rejected_invoke(request: pb.ApprovalRequest) -> pb.InvokeResponse:
    """What the model gets for an approval nobody answered in time: the request's own
    ``rejected_output`` (Codex's ``exec command rejected by user``), success false."""
    return pb.InvokeResponse(call_id=request.call_id, output=request.rejected_output, success=False)


def shell_event_result(event: pb.ShellStreamEvent) -> pb.ShellResponse | None:
    """The final result a streaming shell event carries (its ``end``), else None."""
    return event.end if event.WhichOneof("event") == "end" else None


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
