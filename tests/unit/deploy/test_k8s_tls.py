"""deploy/k8s's TLS: each pod gets only its own role's key, and that is enough.

The Secrets come from the real `make-certs.sh` (fixture `tree`); their certificates must
carry their role and name every host the pod dials, and read as each service reads its
credentials they must complete mutual TLS on every edge the NetworkPolicy allows, under
the names dialled (real gRPC health checks on loopback with the TLS name overridden).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from tidal.common.config.shared import SERVICES
from tidal.common.security.config import SecurityConfig
from tidal.common.security.credentials import role_of_certificate
from tidal.common.security.transport import TransportSecurity

from .k8s_render import (
    Obj,
    callers_by_authz,
    environment,
    secret_files,
    workload,
)


def _dialled_hosts(env: dict[str, str]) -> Iterator[str]:
    for key, value in env.items():
        if key.startswith("TIDAL_ENDPOINTS__"):
            addresses = json.loads(value) if value.startswith("[") else [value]
            yield from (a.rsplit(":", 1)[0] for a in addresses)


@pytest.mark.parametrize("role", SERVICES)
def test_each_pod_mounts_only_its_own_key_and_certificates_cover_the_names_dialled(
    rendered: dict[str, list[Obj]], role: str
) -> None:
    objects = rendered["cpu"]
    pod = workload(objects, role)["spec"]["template"]["spec"]
    secrets = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
    assert secrets == [f"tidal-tls-{role}"]
    files = secret_files(objects, secrets[0])
    assert set(files) == {"ca.pem", f"{role}.pem", f"{role}.key"}
    assert role_of_certificate(files[f"{role}.pem"]) == role
    cert = x509.load_pem_x509_certificate(files[f"{role}.pem"])
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns_names = set(names.get_values_for_type(x509.DNSName))
    assert set(_dialled_hosts(environment(objects, role))) <= dns_names
    assert "localhost" in dns_names  # the health probe dials 127.0.0.1 (an IP SAN, always)
    for secret in (o for o in objects if o["kind"] == "Secret"):
        assert "ca.key" not in secret["data"] and "operator.key" not in secret["data"]


def _mounted_security(objects: list[Obj], role: str, folder: Path) -> TransportSecurity:
    """`role`'s credentials read as its service reads them, from a folder holding only
    what its pod mounts (its Secret's files)."""
    folder.mkdir()
    for name, data in secret_files(objects, f"tidal-tls-{role}").items():
        (folder / name).write_bytes(data)
    config = SecurityConfig.model_validate({"tls_dir": str(folder)})
    return TransportSecurity.from_config(config, role, folder)


async def _health(server: TransportSecurity, client: TransportSecurity, host: str) -> str:
    """Health status a `client` gets from a `server` it dials as `host` (the TLS name)."""
    grpc_server = grpc.aio.server()
    health = health_aio.HealthServicer()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health, grpc_server)
    credentials = server.server_credentials()
    assert credentials is not None
    port = grpc_server.add_secure_port("127.0.0.1:0", credentials)
    await grpc_server.start()
    options = [] if host == "127.0.0.1" else [("grpc.ssl_target_name_override", host)]
    channel_credentials = client.channel_credentials()
    assert channel_credentials is not None
    try:
        async with grpc.aio.secure_channel(
            f"127.0.0.1:{port}", channel_credentials, options=options
        ) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
            except grpc.aio.AioRpcError as error:
                return error.code().name
            return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    finally:
        await grpc_server.stop(None)


async def test_mutual_tls_works_between_the_mounted_secrets_under_the_names_dialled(
    rendered: dict[str, list[Obj]], tmp_path: Path
) -> None:
    """Each pod's Secret alone suffices: every caller's credentials complete mTLS with each
    callee's under the name the caller dials, and each role probes itself on 127.0.0.1."""
    objects = rendered["cpu"]
    security = {role: _mounted_security(objects, role, tmp_path / role) for role in SERVICES}
    for role in SERVICES:
        assert await _health(security[role], security[role], "127.0.0.1") == "SERVING"
    env = environment(objects, "orchestrator")
    dialled = {
        "inference": [
            a.rsplit(":", 1)[0] for a in json.loads(env["TIDAL_ENDPOINTS__INFERENCE_REPLICAS"])
        ],
        "trainer": [env["TIDAL_ENDPOINTS__TRAINER"].rsplit(":", 1)[0]],
        "weightsync": [env["TIDAL_ENDPOINTS__WEIGHTSYNC"].rsplit(":", 1)[0]],
    }
    edges = 0
    for callee, callers in callers_by_authz().items():
        for caller in callers - {"operator"}:
            for host in dialled[callee]:
                status = await _health(security[callee], security[caller], host)
                assert status == "SERVING", (caller, callee, host)
                edges += 1
    assert edges == 6  # orchestrator to 2 replicas, trainer, weightsync; trainer, inference
    # The name is checked: a replica the certificates were not made for is refused.
    unnamed = await _health(
        security["inference"], security["orchestrator"], "inference-2.inference"
    )
    assert unnamed == "UNAVAILABLE"
