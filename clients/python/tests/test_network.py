"""Network modes from the Python client: ``open_session(network="proxy", allow_domains=…,
deny_domains=…)``, ``set_network_rules`` (sync and async), and the daemon's refusals naming the
field. Against a real daemon whose ``[egress]`` table points test names at a small HTTP server on
127.0.0.2 and lets the proxy reach loopback (as tests/it/egress.rs does); commands run curl and
Python's urllib inside the sandbox, through the proxy the session's environment names.
"""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import Daemon, private_dir, remove_private_dir, session_env
from corral_client import Client, FailedPrecondition, InvalidArgument, pb
from corral_client.aio import AsyncClient

CONFIG = """
[egress]
allowed_networks = ["127.0.0.0/8"]

[egress.hosts]
"allowed.test" = ["127.0.0.2"]
"other.allowed.test" = ["127.0.0.2"]
"sub.allowed.test" = ["127.0.0.2"]
"denied.test" = ["127.0.0.2"]
"""


class _Upstream(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = f"hello from upstream {self.path}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def upstream():
    """The port of an HTTP server on 127.0.0.2 answering `hello from upstream PATH`."""
    server = ThreadingHTTPServer(("127.0.0.2", 0), _Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def egress_daemon():
    state = private_dir("corral-pytest-egress-")
    config = state / "corral.toml"
    config.write_text(CONFIG, encoding="utf-8")
    d = Daemon(extra=("--config", str(config)))
    yield d
    d.stop()
    remove_private_dir(state)


def curl(host: str, port: int, path: str = "/") -> str:
    """A script printing the body, then the HTTP status on its own last line."""
    return f"curl -sS --max-time 20 -w '\\n%{{http_code}}' http://{host}:{port}{path}"


def status(output: str) -> str:
    return output.rstrip("\n").rsplit("\n", 1)[-1]


def test_a_proxied_session_reaches_only_allowed_hosts_and_set_network_rules_changes_them(
    egress_daemon, upstream, workspace
):
    port = upstream
    with Client(egress_daemon.target, timeout=60) as client:
        with client.open_session(
            workspace,
            "read-only",
            env=session_env(workspace),
            network="proxy",
            allow_domains=["allowed.test", "*.allowed.test"],
            deny_domains=["other.allowed.test"],
        ) as s:
            # The proxy is named in the command's environment, on its own loopback.
            ran = s.shell(script="echo $HTTP_PROXY")
            assert ran.exit_code == 0 and ran.stdout.head.decode().startswith("http://127.0.0.1:"), ran.text

            ran = s.shell(script=curl("allowed.test", port, "/curl"))
            out = ran.combined.head.decode()
            assert ran.exit_code == 0, out
            assert out.startswith("hello from upstream /curl") and status(out) == "200", out
            # Python's urllib reads the proxy variables too.
            ran = s.shell(
                [
                    "python3",
                    "-c",
                    "import urllib.request;"
                    f"print(urllib.request.urlopen('http://allowed.test:{port}/py').read().decode(), end='')",
                ]
            )
            assert ran.exit_code == 0, ran.text
            assert ran.stdout.head.decode() == "hello from upstream /py\n"

            # No allow rule, and a deny rule over an allow rule: the proxy's 403, naming the host.
            out = s.shell(script=curl("denied.test", port)).combined.head.decode()
            assert status(out) == "403" and "denied.test" in out, out
            assert "hello from upstream" not in out
            out = s.shell(script=curl("other.allowed.test", port)).combined.head.decode()
            assert status(out) == "403" and "deny" in out, out
            # Around the proxy: nothing (no DNS, no route).
            ran = s.shell(script=f"curl -sS --noproxy '*' --max-time 5 http://127.0.0.2:{port}/")
            assert ran.exit_code != 0 and "hello from upstream" not in ran.text, ran.text

            # New rules for the next connections: the denied name now, and no longer the other.
            assert s.set_network_rules(["denied.test"]) is None
            out = s.shell(script=curl("denied.test", port, "/now")).combined.head.decode()
            assert out.startswith("hello from upstream /now") and status(out) == "200", out
            out = s.shell(script=curl("allowed.test", port)).combined.head.decode()
            assert status(out) == "403", out
            # The model is told the rules in force.
            assert "<allowed>denied.test</allowed>" in s.get_prompt_context().environment_context

            # By the client with the id: a subdomain rule, minus one subdomain; then no rules.
            client.set_network_rules(
                s.id, allow_domains=["*.allowed.test"], deny_domains=["other.allowed.test"]
            )
            out = s.shell(script=curl("sub.allowed.test", port, "/sub")).combined.head.decode()
            assert out.startswith("hello from upstream /sub") and status(out) == "200", out
            for host in ("denied.test", "allowed.test"):  # no rule; not a subdomain of itself
                out = s.shell(script=curl(host, port)).combined.head.decode()
                assert status(out) == "403", (host, out)
            out = s.shell(script=curl("other.allowed.test", port)).combined.head.decode()
            assert status(out) == "403", out
            client.set_network_rules(s.id)  # no rules: nothing is reachable
            out = s.shell(script=curl("sub.allowed.test", port)).combined.head.decode()
            assert status(out) == "403", out


def test_the_async_client_opens_a_proxied_session_and_sets_its_rules(egress_daemon, upstream, workspace):
    port = upstream

    async def main() -> tuple[str, str, str]:
        async with AsyncClient(egress_daemon.target, timeout=60) as client:
            async with await client.open_session(
                workspace, env=session_env(workspace), network="proxy", allow_domains=[f"allowed.test:{port}"]
            ) as s:
                before = (await s.shell(script=curl("allowed.test", port, "/aio"))).combined.head.decode()
                await s.set_network_rules(allow_domains=[f"allowed.test:{port + 1}"])  # another port only
                after = (await s.shell(script=curl("allowed.test", port))).combined.head.decode()
                await client.set_network_rules(s.id, [f"denied.test:{port}"])
                denied = (await s.shell(script=curl("denied.test", port, "/d"))).combined.head.decode()
                return before, after, denied

    before, after, denied = asyncio.run(main())
    assert before.startswith("hello from upstream /aio") and status(before) == "200", before
    assert status(after) == "403", after
    assert denied.startswith("hello from upstream /d"), denied


def test_bad_rules_and_contradictions_raise_invalid_argument_naming_the_field(egress_daemon, workspace):
    env = session_env(workspace)
    with Client(egress_daemon.target, timeout=60) as client:
        refused = [
            (dict(network="proxy", allow_domains=["ok.test", "*"]), "allow_domains[1]"),
            (dict(network="proxy", allow_domains=["https://x.test"]), "allow_domains[0]"),
            (dict(network="proxy", deny_domains=["*.com"]), "deny_domains[0]"),
            # network_access=True says "on": with "proxy" (or "off") it is refused by the daemon.
            (dict(network="proxy", network_access=True), "network_mode"),
            (dict(network="off", network_access=True), "network_mode"),
            (dict(network="on", allow_domains=["x.test"]), "allow_domains"),
            (dict(allow_domains=["x.test"]), "allow_domains"),
        ]
        for kwargs, field in refused:
            with pytest.raises(InvalidArgument) as e:
                client.open_session(workspace, env=env, **kwargs)
            assert [v.field for v in e.value.field_violations] == [field], (kwargs, e.value)
        with pytest.raises(InvalidArgument) as e:
            client.open_session(workspace, "danger-full-access", env=env, network="proxy")
        assert e.value.field_violations[0].field == "network_mode", e.value

        # Client-side: an unknown mode name, a lone string where a list of rules goes.
        with pytest.raises(ValueError, match="proxy"):
            client.open_session(workspace, env=env, network="proxied")
        with pytest.raises(TypeError, match="list of rules"):
            client.open_session(workspace, env=env, network="proxy", allow_domains="x.test")

        # A malformed rule changes nothing; a session of another mode has no rules to set.
        with client.open_session(workspace, env=env, network="proxy", allow_domains=["x.test"]) as s:
            with pytest.raises(InvalidArgument) as e:
                s.set_network_rules(["ok.test", "*.com"])
            assert [v.field for v in e.value.field_violations] == ["allow_domains[1]"], e.value
            assert "<allowed>x.test</allowed>" in s.get_prompt_context().environment_context
            with pytest.raises(TypeError, match="list of rules"):
                s.set_network_rules("x.test")
        for kwargs in (dict(network="off"), dict(network="on"), dict(), dict(network=pb.NETWORK_MODE_OFF)):
            with client.open_session(workspace, env=env, **kwargs) as s:
                with pytest.raises(FailedPrecondition):
                    s.set_network_rules(["x.test"])
