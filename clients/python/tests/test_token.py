"""Bearer tokens, as the corral CLI sends them (src/client/cli.rs `tcp_auth`, connect.rs): token= or
$CORRAL_TOKEN, for TCP targets only and only over TLS, as ``authorization: Bearer TOKEN``. Against a
real daemon serving TLS itself with a [[tokens]] entry; and the friendlier errors of a Unix socket
that is missing or refuses connections."""

from __future__ import annotations

import asyncio
import hashlib
import os
import pwd
import shutil
import socket
import subprocess

import pytest
from conftest import Daemon, free_tcp_port, private_dir, remove_private_dir
from corral_client import Client, InvalidArgument, Unauthenticated, Unavailable
from corral_client.aio import AsyncClient

TOKEN = "token-123"


@pytest.fixture(scope="module")
def tls_daemon():
    """`corral serve` on loopback TCP with its own TLS certificate (self-signed, for localhost)
    and one token mapped to this user. Its config and key are its state: outside /tmp."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a throwaway certificate")
    pki = private_dir("corral-pytest-pki-")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=corral test",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-addext", "basicConstraints=critical,CA:FALSE",
         "-addext", "extendedKeyUsage=serverAuth", "-keyout", str(pki / "key.pem"), "-out", str(pki / "cert.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    user = pwd.getpwuid(os.geteuid()).pw_name
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    (pki / "corral.toml").write_text(
        f'[tls]\ncert = "{pki}/cert.pem"\nkey = "{pki}/key.pem"\n'
        f'[[tokens]]\nname = "test"\nsha256 = "{digest}"\nuser = "{user}"\n'
    )
    cert = (pki / "cert.pem").read_bytes()
    d = Daemon(
        listen=f"tcp:127.0.0.1:{free_tcp_port()}",
        extra=("--config", str(pki / "corral.toml")),
        client_kwargs={"root_certificates": cert, "token": TOKEN},
    )
    d.cert = cert
    d.user = user
    yield d
    d.stop()
    remove_private_dir(pki)


def test_token_argument_over_tls(tls_daemon, workspace, monkeypatch):
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    with Client(tls_daemon.target, root_certificates=tls_daemon.cert, token=TOKEN, timeout=30) as c:
        assert c.health() == "SERVING"
        with c.open_session(workspace) as s:
            assert s.shell(["id", "-un"]).stdout.head.decode().strip() == tls_daemon.user


def test_corral_token_from_the_environment(tls_daemon, workspace, monkeypatch):
    monkeypatch.setenv("CORRAL_TOKEN", TOKEN)
    # By address (the certificate names 127.0.0.1) and by name with server_name.
    with Client(tls_daemon.target, root_certificates=tls_daemon.cert, timeout=30) as c:
        with c.open_session(workspace) as s:
            assert s.list_dir(".").absolute_path.startswith(str(workspace))
    port = tls_daemon.target.rsplit(":", 1)[1]
    with Client(f"tcp:localhost:{port}", root_certificates=tls_daemon.cert, timeout=30) as c:
        c.open_session(workspace).close()


def test_the_async_client_sends_the_token_too(tls_daemon, workspace, monkeypatch):
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)

    async def main():
        async with AsyncClient(tls_daemon.target, root_certificates=tls_daemon.cert, token=TOKEN, timeout=30) as c:
            async with await c.open_session(workspace) as s:
                return (await s.list_dir(".")).absolute_path

    assert asyncio.run(main()).startswith(str(workspace))


def test_no_token_or_a_wrong_one_is_unauthenticated(tls_daemon, workspace, monkeypatch):
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    with Client(tls_daemon.target, root_certificates=tls_daemon.cert, timeout=30) as c:
        with pytest.raises(Unauthenticated):
            c.open_session(workspace)
    with Client(tls_daemon.target, root_certificates=tls_daemon.cert, token="token-124", timeout=30) as c:
        with pytest.raises(Unauthenticated):
            c.open_session(workspace)
    monkeypatch.setenv("CORRAL_TOKEN", "token-124")
    with Client(tls_daemon.target, root_certificates=tls_daemon.cert, timeout=30) as c:
        with pytest.raises(Unauthenticated):
            c.open_session(workspace)


def test_a_token_is_never_sent_over_plain_tcp(monkeypatch):
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    with pytest.raises(InvalidArgument, match=r"only sent over TLS, and tcp:127\.0\.0\.1:9 is plain TCP"):
        Client("tcp:127.0.0.1:9", token=TOKEN)
    monkeypatch.setenv("CORRAL_TOKEN", TOKEN)
    with pytest.raises(InvalidArgument, match=r"\(token= or \$CORRAL_TOKEN\) is only sent over TLS"):
        Client("tcp:127.0.0.1:9")
    with pytest.raises(InvalidArgument, match="only sent over TLS"):
        AsyncClient("127.0.0.1:9")


def test_unix_sockets_ignore_corral_token_and_refuse_a_token_argument(daemon, monkeypatch):
    monkeypatch.setenv("CORRAL_TOKEN", TOKEN)
    with Client(daemon.target, timeout=30) as c:
        assert c.health() == "SERVING"
    with pytest.raises(InvalidArgument, match="is a Unix socket, where the kernel says who you are"):
        Client(daemon.target, token=TOKEN)


def test_a_token_with_characters_a_header_cannot_carry(monkeypatch):
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    with pytest.raises(InvalidArgument, match="characters a header cannot carry"):
        Client("tcp:127.0.0.1:9", tls=True, token="a\nb")


def test_a_missing_socket_says_so(monkeypatch):
    d = private_dir()
    try:
        with Client(d / "corral.sock", timeout=5) as c:
            with pytest.raises(Unavailable) as e:
                c.capabilities()
        assert e.value.message.startswith(f"cannot connect to {d}/corral.sock: no such socket (is `corral serve` running?")
    finally:
        remove_private_dir(d)


def test_a_socket_nobody_listens_on_says_refused():
    d = private_dir()
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(d / "corral.sock"))  # bound, never listening: what a dead daemon leaves
        s.close()
        with Client(d / "corral.sock", timeout=5) as c:
            with pytest.raises(Unavailable) as e:
                c.wait_ready(timeout=1)
        assert e.value.message.startswith(f"cannot connect to {d}/corral.sock: connection refused"), e.value.message
        assert "is `corral serve` running?" in e.value.message

        async def main():
            async with AsyncClient(d / "corral.sock", timeout=5) as c:
                await c.capabilities()

        with pytest.raises(Unavailable, match="connection refused"):
            asyncio.run(main())
    finally:
        remove_private_dir(d)
