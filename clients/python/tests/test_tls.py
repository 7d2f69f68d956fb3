"""TCP+TLS: corral listens on Unix sockets and loopback TCP; a TLS front (such as a proxy) is stood
in for by a Python gRPC server with the corral.v1 services and a throwaway certificate."""

from __future__ import annotations

import shutil
import subprocess
from concurrent import futures

import grpc
import pytest

from corral_client import Client, PermissionDenied, Unavailable, pb
from corral_client._proto import corral_pb2_grpc as pb_grpc


class StandIn(pb_grpc.SessionsServicer):
    def GetCapabilities(self, request, context):
        return pb.GetCapabilitiesResponse(api_version="corral.v1", server_version="tls-stand-in")

    def OpenSession(self, request, context):
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "no sessions here")


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a throwaway certificate")
    d = tmp_path_factory.mktemp("tls")
    key, cert = d / "key.pem", d / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_SessionsServicer_to_server(StandIn(), server)
    creds = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    yield port, cert
    server.stop(grace=None)


def test_tls_with_a_root_certificate(tls_server, tmp_path):
    port, cert = tls_server
    # The certificate names localhost; connect by address and check the name given.
    with Client(
        f"tcp:127.0.0.1:{port}", root_certificates=str(cert), server_name="localhost", timeout=10
    ) as c:
        assert c.capabilities().server_version == "tls-stand-in"
        with pytest.raises(PermissionDenied) as e:
            c.open_session(tmp_path, "read-only")
        assert e.value.message == "no sessions here"
    with Client(f"localhost:{port}", root_certificates=cert.read_bytes(), timeout=10) as c:
        assert c.capabilities().api_version == "corral.v1"


def test_tls_rejects_an_untrusted_server(tls_server):
    port, _ = tls_server
    # The system roots do not trust the throwaway certificate.
    with Client(f"localhost:{port}", tls=True, timeout=5) as c:
        with pytest.raises(Unavailable):
            c.capabilities()
