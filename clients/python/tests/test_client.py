"""The client against a real daemon: sessions, every typed RPC, the bridge, errors, transports."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

import corral_client
import grpc
import pytest
from conftest import Daemon, corral_bin, free_tcp_port, normalize, populate, session_env
from corral_client import (
    ChatCompletionsAdapter,
    Client,
    CorralError,
    FieldViolation,
    InvalidArgument,
    NotFound,
    ResponsesAdapter,
    Unavailable,
    pb,
)
from corral_client.client import _grpc_target


@pytest.fixture
def session(client, workspace):
    populate(workspace, {"a.txt": "one\ntwo\nthree\n", "sub/b.py": "def f():\n    return 1\n"})
    with client.open_session(workspace, "workspace-write", env=session_env(workspace)) as s:
        yield s


def test_health_and_capabilities(client):
    assert client.health() == "SERVING"
    assert client.health("corral.v1.Bridge") == "SERVING"
    caps = client.capabilities()
    assert caps.api_version == "corral.v1"
    assert {"read_file", "list_dir", "grep_files", "shell"} <= set(caps.tools)


def test_session_context_manager_closes(client, workspace):
    with client.open_session(workspace, "read-only") as s:
        assert len(s.id) == 32
        assert s.list_dir(".").text == f"Absolute path: {workspace}/."
    assert s.closed
    with pytest.raises(NotFound) as e:
        s.read_file("/etc/hostname")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert "not found" in e.value.message
    # Closing twice is an error only when asked for.
    s.closed = False
    with pytest.raises(NotFound):
        s.close()
    s.close(missing_ok=True)


def test_typed_rpcs_match_the_bridge(session, workspace):
    r = session.read_file("a.txt", offset=2, limit=1)
    assert r.path == f"{workspace}/a.txt"
    assert [(l.number, l.text) for l in r.lines] == [(2, "two")]
    assert r.text == "L2: two"
    assert session.invoke("read_file", {"file_path": "a.txt", "offset": 2, "limit": 1}).output == r.text

    r = session.read_file("sub/b.py", mode="indentation", offset=2, indentation={"max_levels": 1})
    assert r.text.startswith("L1: def f():")

    d = session.list_dir(".", depth=2)
    assert [(e.relative_path, e.kind) for e in d.entries] == [
        ("a.txt", pb.ENTRY_KIND_FILE),
        ("sub", pb.ENTRY_KIND_DIRECTORY),
        ("sub/b.py", pb.ENTRY_KIND_FILE),
    ]
    assert not d.more_entries
    assert session.invoke("list_dir", {"dir_path": ".", "depth": 2}).output == d.text

    g = session.grep_files("return", include="*.py")
    assert [m.path for m in g.matches] == [f"{workspace}/sub/b.py"]
    assert g.text == f"{workspace}/sub/b.py"
    none = session.grep_files("nothing_matches_this")
    assert none.text == "No matches found." and not none.matches


def test_shell_and_stream(session, workspace):
    r = session.shell(["bash", "-c", "echo out; sleep 0.05; echo err >&2; exit 4"])
    assert (r.exit_code, r.success) == (4, False)
    assert r.stdout.head == b"out\n" and r.stderr.head == b"err\n"
    assert r.combined.head == b"out\nerr\n" and r.combined.total_bytes == 8
    assert normalize(r.text) == '{"output":"out\\nerr\\n","metadata":{"exit_code":4,"duration_seconds":0.0}}'

    r = session.shell(script="pwd", login=False)
    assert r.success and r.text.endswith(f"Output:\n{workspace}\n")

    with pytest.raises(TypeError):
        session.shell("echo hi")
    with pytest.raises(TypeError):
        session.shell(["true"], script="true")

    stream = session.shell_stream(["bash", "-c", "echo a; echo b >&2; echo c"])
    events = list(stream)
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "begin" and kinds[-1] == "end" and set(kinds[1:-1]) == {"delta"}
    assert events[0].begin.cwd == str(workspace)
    deltas = [e.delta for e in events[1:-1]]
    assert [d.seq for d in deltas] == list(range(len(deltas)))
    # Arrival order across the two pipes is the reader's; within a stream it is exact.
    out = b"".join(d.data for d in deltas if d.stream == pb.OUTPUT_STREAM_STDOUT)
    err = b"".join(d.data for d in deltas if d.stream == pb.OUTPUT_STREAM_STDERR)
    assert (out, err) == (b"a\nc\n", b"b\n")
    assert stream.result is not None and stream.result.exit_code == 0
    assert stream.result.combined.head == b"".join(d.data for d in deltas)

    assert session.shell_stream(script="exit 7", login=False).wait().exit_code == 7


def test_shell_stream_cancel(session):
    with session.shell_stream(["bash", "-c", "echo started; sleep 30"]) as stream:
        for event in stream:
            if event.WhichOneof("event") == "delta":
                break
    assert stream.result is None
    # The call was cancelled; the session still works.
    assert session.shell(["true"]).success


def test_list_tools_shapes(session):
    responses = session.list_tools()
    names = [t["name"] for t in responses]
    # A default session offers Codex's default set: unified exec, not `shell`.
    assert {"exec_command", "write_stdin", "read_file", "list_dir", "grep_files"} <= set(names)
    assert {"update_plan", "view_image", "apply_patch"} <= set(names)
    assert all(t["type"] in ("function", "custom") for t in responses)
    chat = session.list_tools("chat")
    assert all(set(t) == {"type", "function"} and t["type"] == "function" for t in chat)
    assert [t["function"]["name"] for t in chat if t["function"]["name"] in names] == [
        n for n in names if n in {t["function"]["name"] for t in chat}
    ]
    read_file = next(t for t in responses if t["name"] == "read_file")
    assert list(read_file) == ["type", "name", "description", "strict", "parameters"]
    assert "read_file" not in [t["name"] for t in session.list_tools(exclude=["read_file"])]
    assert ResponsesAdapter(session).tools() == responses
    assert ChatCompletionsAdapter(session).tools() == chat
    assert [t["name"] for t in ResponsesAdapter(session, exclude=["shell"]).tools()] == [
        n for n in names if n != "shell"
    ]


def test_bridge_failures_are_model_text(session):
    r = session.invoke("read_file", "{}", call_id="c1")
    assert (r.call_id, r.success) == ("c1", False)
    assert r.output == "failed to parse function arguments: missing field `file_path` at line 1 column 2"
    r = session.invoke("no_such_tool", "{}", call_id="c2")
    assert not r.success and r.output


def test_adapters_take_sdk_objects(session):
    """OpenAI's SDK returns objects, not dicts: attributes work the same."""
    item = SimpleNamespace(
        type="function_call", name="read_file", arguments='{"file_path":"a.txt","limit":1}', call_id="o1"
    )
    adapter = ResponsesAdapter(session)
    assert adapter.handle(item) == {"type": "function_call_output", "call_id": "o1", "output": "L1: one"}
    message = SimpleNamespace(type="message", role="assistant", content=[])
    assert not adapter.is_tool_call(message)
    with pytest.raises(ValueError):
        adapter.handle(message)
    assert adapter.handle_all([message, item]) == [adapter.handle(item)]

    tc = SimpleNamespace(
        id="o2",
        type="function",
        function=SimpleNamespace(name="read_file", arguments='{"file_path":"a.txt","limit":1}'),
    )
    assert ChatCompletionsAdapter(session).handle(tc) == {
        "role": "tool",
        "tool_call_id": "o2",
        "content": "L1: one",
    }


def test_errors_carry_details(client, workspace):
    with pytest.raises(InvalidArgument) as e:
        client.open_session(workspace, pb.SANDBOX_MODE_UNSPECIFIED)
    err = e.value
    assert isinstance(err, CorralError)
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.message.startswith("mode is required")
    assert err.field_violations and err.field_violations[0].field == "mode"
    assert isinstance(err.field_violations[0], FieldViolation)
    assert str(err).startswith("INVALID_ARGUMENT: mode is required")

    missing = workspace / "missing"
    with pytest.raises(InvalidArgument) as e:
        client.open_session(missing, "read-only")
    assert e.value.field_violations[0].field == "cwd"

    with pytest.raises(NotFound):
        client.close_session("0" * 32)
    with pytest.raises(ValueError):
        client.open_session(workspace, "sandboxed-please")


def test_typed_tool_errors(session):
    with pytest.raises(NotFound) as e:
        session.read_file("nope.txt")
    # The daemon may name the path first (newer daemons do).
    assert e.value.message.endswith("failed to read file: No such file or directory (os error 2)"), e.value.message
    with pytest.raises(InvalidArgument) as e:
        session.read_file("a.txt", offset=0)
    assert e.value.message.endswith("offset must be a 1-indexed line number"), e.value.message


def test_unavailable_when_nothing_listens(tmp_path):
    with Client(tmp_path / "nothing.sock", timeout=2) as c:
        with pytest.raises(Unavailable):
            c.capabilities()
        with pytest.raises(Unavailable):
            c.wait_ready(timeout=0.2)


def test_tcp_transport(workspace):
    port = free_tcp_port()
    # Plain TCP carries no caller identity: the daemon asks for an explicit opt-in.
    help_text = subprocess.run(
        [str(corral_bin()), "serve", "--help"], capture_output=True, text=True, check=False
    ).stdout
    extra = ("--insecure-loopback-tcp",) if "--insecure-loopback-tcp" in help_text else ()
    d = Daemon(listen=f"tcp:127.0.0.1:{port}", extra=extra)
    try:
        for target in (f"tcp:127.0.0.1:{port}", f"127.0.0.1:{port}"):
            with Client(target, timeout=10) as c:
                with c.open_session(workspace, "read-only") as s:
                    assert s.list_dir(".").text == f"Absolute path: {workspace}/."
    finally:
        d.stop()


def test_target_syntax(monkeypatch):
    assert _grpc_target("unix:/run/x.sock") == ("unix:/run/x.sock", True)
    assert _grpc_target("unix:///run/x.sock") == ("unix:/run/x.sock", True)
    assert _grpc_target("/run/x.sock") == ("unix:/run/x.sock", True)
    assert _grpc_target("./x.sock") == ("unix:" + os.path.abspath("x.sock"), True)
    assert _grpc_target("tcp:127.0.0.1:7000") == ("127.0.0.1:7000", False)
    assert _grpc_target("localhost:7000") == ("localhost:7000", False)


def test_socket_rule(monkeypatch, tmp_path):
    # The same rule as the corral CLI (src/daemon/socket.rs): CORRAL_SOCKET > this user's
    # daemon if it is listening > the system daemon; never a /tmp fallback.
    monkeypatch.setenv("CORRAL_SOCKET", "tcp:127.0.0.1:9")
    assert corral_client.default_target() == "tcp:127.0.0.1:9"
    monkeypatch.setenv("CORRAL_SOCKET", "")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert corral_client.default_target() == "unix:/run/corral/corral.sock"
    (tmp_path / "corral").mkdir()
    (tmp_path / "corral" / "corral.sock").write_text("")
    own = f"unix:{tmp_path}/corral/corral.sock"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert corral_client.default_target() == own
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert corral_client.default_target() == "unix:/run/corral/corral.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert corral_client.default_target() == "unix:/run/corral/corral.sock"


def _socket_in(directory, mode):
    import socket as socketmod

    directory.mkdir()
    path = directory / "s.sock"
    s = socketmod.socket(socketmod.AF_UNIX)
    s.bind(str(path))
    os.chmod(directory, mode)
    return s, path


def test_check_socket_refuses_untrusted_directories(tmp_path):
    me = os.geteuid()
    # Missing socket: left for the connection to report.
    corral_client.check_socket(tmp_path / "missing.sock")
    s, own = _socket_in(tmp_path / "own", 0o700)
    corral_client.check_socket(own)
    s, shared = _socket_in(tmp_path / "shared", 0o755)
    corral_client.check_socket(shared)
    for name, mode in (("world", 0o777), ("group", 0o770), ("sticky", 0o1777)):
        s, bad = _socket_in(tmp_path / name, mode)
        with pytest.raises(corral_client.PermissionDenied) as e:
            corral_client.check_socket(bad)
        assert str(bad.parent) in e.value.message and f"{mode:04o}" in e.value.message
        # The client refuses it too, before connecting.
        with pytest.raises(corral_client.PermissionDenied):
            Client(str(bad))
    if me != 0:
        pytest.skip("the other-owner cases need root (CI runs as root)")
    s, theirs = _socket_in(tmp_path / "theirs", 0o755)
    os.chown(theirs.parent, 65534, -1)
    with pytest.raises(corral_client.PermissionDenied) as e:
        corral_client.check_socket(theirs)
    assert "uid 65534" in e.value.message
    # ...fine for that user itself.
    corral_client.check_socket(theirs, uid=65534)
    os.chown(theirs.parent, 0, -1)
    os.chown(theirs, 65534, -1)
    with pytest.raises(corral_client.PermissionDenied) as e:
        Client(f"unix:{theirs}")
    assert "impostor" in e.value.message


def test_client_honours_corral_socket(monkeypatch, daemon, workspace):
    monkeypatch.setenv("CORRAL_SOCKET", str(daemon.socket))
    with Client(timeout=10) as c:
        with c.open_session(workspace, "read-only") as s:
            assert s.list_dir(".").text.startswith(f"Absolute path: {workspace}")
