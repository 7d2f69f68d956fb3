"""Stock grpcio on the Unix socket, with no channel options.

gRPC C-core sends the socket's path (percent-encoded) as the HTTP/2 :authority; the daemon's
HTTP/2 layer used to reset every such call with PROTOCOL_ERROR, health checks and reflection
included (vendor/h2/PATCH.md). No corral_client.Client here: it overrides the authority. Only
the generated message stubs and the standard grpcio-health-checking and grpcio-reflection
packages, as any gRPC user would have them.
"""

from __future__ import annotations

import grpc
import pytest
from conftest import session_env
from corral_client import pb
from corral_client._proto import corral_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

TIMEOUT = 30


@pytest.fixture(params=["unix:{}", "unix://{}"], ids=["unix:PATH", "unix://PATH"])
def channel(request, daemon):
    with grpc.insecure_channel(request.param.format(daemon.socket)) as ch:
        yield ch


def test_health_check(channel):
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "corral.v1.Sessions", "corral.v1.Tools"):
        resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING, service


def test_reflection_lists_corral_services(channel):
    services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert {"corral.v1.Sessions", "corral.v1.Tools", "corral.v1.Bridge"} <= set(services)


def test_corral_rpcs(channel, workspace):
    (workspace / "hello.txt").write_text("hello from stock grpcio\n", encoding="utf-8")
    sessions = corral_pb2_grpc.SessionsStub(channel)
    caps = sessions.GetCapabilities(pb.GetCapabilitiesRequest(), timeout=TIMEOUT)
    assert caps.api_version == "corral.v1"
    opened = sessions.OpenSession(
        pb.OpenSessionRequest(
            cwd=str(workspace), mode=pb.SANDBOX_MODE_READ_ONLY, env=session_env(workspace)
        ),
        timeout=TIMEOUT,
    )
    try:
        read = corral_pb2_grpc.ToolsStub(channel).ReadFile(
            pb.ReadFileRequest(session_id=opened.session_id, file_path="hello.txt"), timeout=TIMEOUT
        )
        assert "hello from stock grpcio" in read.text
    finally:
        sessions.CloseSession(pb.CloseSessionRequest(session_id=opened.session_id), timeout=TIMEOUT)
