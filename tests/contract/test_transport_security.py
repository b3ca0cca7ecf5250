"""Transport security against real services on loopback: a real weight-sync service and a
real trainer (`start_trainer`, which publishes to it), over mTLS and in token mode.

One run per mode asserts the whole model (it costs one tiny trainer start): the trainer's
own publish works; the orchestrator's Train works; wrong roles (inference or operator
calling Train, operator calling Publish/UploadWeights, orchestrator calling BeginLoad) get
PERMISSION_DENIED naming the method and role; the trainer's own Publish of a location
outside `<root>/v<version>` is still INVALID_ARGUMENT; no credentials, a forged token or a
certificate from another CA are refused; a plaintext client cannot connect; reflection is
off; health is open.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tidal.common.config.shared import GrpcConfig
from tidal.common.errors import ConfigError
from tidal.common.grpc.channel import make_channel
from tidal.common.grpc.server import GrpcServer
from tidal.common.security.credentials import ensure_certificates
from tidal.common.security.transport import PLAINTEXT_LOOPBACK, TransportSecurity
from tidal.rpc.v1 import common_pb2
from tidal.rpc.v1 import trainer_pb2_grpc as trainer_grpc
from tidal.rpc.v1 import weightsync_pb2 as ws_pb
from tidal.rpc.v1 import weightsync_pb2_grpc as ws_grpc
from tidal.trainer.config import TrainerRunConfig
from tidal.trainer.main import start_trainer

from ..tls_fixtures import role_security
from .test_trainer_service import TINY_MODEL, request

if TYPE_CHECKING:
    from conftest import StartWeightSync

DENIED = grpc.StatusCode.PERMISSION_DENIED


async def code_of(call: object) -> grpc.StatusCode:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def denied(call: object, method: str, role: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    assert info.value.code() == DENIED, info.value.details()
    assert method in info.value.details() and repr(role) in info.value.details()


async def upload(stub: ws_grpc.WeightSyncServiceStub) -> grpc.StatusCode:
    return await code_of(stub.UploadWeights(iter([ws_pb.UploadWeightsRequest()]), timeout=10))


@pytest.mark.parametrize("mode", ["mtls", "token"])
async def test_each_role_may_call_only_its_methods(
    mode: str, tmp_path: Path, tls_folder: Path, start_weightsync: StartWeightSync
) -> None:
    ws = await start_weightsync(
        tmp_path / "weights", security=role_security(tls_folder, "weightsync", mode)
    )
    config = TrainerRunConfig.model_validate(
        {
            "run": {"output_dir": str(tmp_path), "name": "sec"},
            "endpoints": {"trainer": "127.0.0.1:0", "weightsync": ws.address},
            "grpc": {"shutdown_grace_s": 0.2},
            "security": {"mode": mode, "tls_dir": str(tls_folder)},
            "trainer": {"model": TINY_MODEL, "device": "cpu", "publish_dir": str(ws.root)},
        }
    )
    trainer = await start_trainer(config)  # publishes version 0 as "trainer": allowed
    address = f"127.0.0.1:{trainer.server.port}"
    channels: list[grpc.aio.Channel] = []

    def dial(role: str, target: str = address) -> grpc.aio.Channel:
        channels.append(make_channel(target, security=role_security(tls_folder, role, mode)))
        return channels[-1]

    try:
        assert ws.registry.newest == 0
        # The orchestrator trains; every role reads status.
        orchestrator = trainer_grpc.TrainerServiceStub(dial("orchestrator"))
        assert (await orchestrator.Train(request(1), timeout=60)).policy_version == 1
        for _ in range(2000):  # version 1 follows the answer (trainer.background_publish)
            if ws.registry.newest == 1:
                break
            await asyncio.sleep(0.01)
        for role in ("operator", "inference", "weightsync"):
            stub = trainer_grpc.TrainerServiceStub(dial(role))
            assert (await stub.GetStatus(common_pb2.StatusRequest(), timeout=10)).step == 1
        # A foreign Train (any other identity) is refused before the trainer sees it.
        method = "/tidal.rpc.v1.TrainerService/Train"
        for role in ("inference", "operator", "trainer"):
            stub = trainer_grpc.TrainerServiceStub(dial(role))
            await denied(stub.Train(request(2), timeout=10), method, role)
        assert ws.registry.newest == 1  # nothing of step 2 was trained or published

        operator = ws_grpc.WeightSyncServiceStub(dial("operator", ws.address))
        await denied(
            operator.Publish(ws_pb.PublishRequest(), timeout=10),
            "/tidal.rpc.v1.WeightSyncService/Publish",
            "operator",
        )
        assert await upload(operator) == DENIED
        assert await upload(ws_grpc.WeightSyncServiceStub(dial("inference", ws.address))) == DENIED
        got = await operator.GetVersion(ws_pb.GetVersionRequest(version=-1), timeout=10)
        assert got.manifest.version == 1
        # The trainer's own role does not lift validation: the Publish attack (a
        # location of the whole weights root, which retention would have deleted) is
        # refused over this transport too, naming the field, and the root survives.
        trainer_ws = ws_grpc.WeightSyncServiceStub(dial("trainer", ws.address))
        attack = ws_pb.PublishRequest(manifest=got.manifest)
        attack.manifest.version, attack.manifest.location = 2, str(ws.root)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await trainer_ws.Publish(attack, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details().startswith("manifest.location"), info.value.details()
        assert (Path(got.manifest.location) / "model.safetensors").is_file()
        assert ws.registry.newest == 1
        orch_ws = ws_grpc.WeightSyncServiceStub(dial("orchestrator", ws.address))
        begin = orch_ws.BeginLoad(ws_pb.BeginLoadRequest(replica_id="x", version=1), timeout=10)
        await denied(begin, "/tidal.rpc.v1.WeightSyncService/BeginLoad", "orchestrator")

        # Health is open; reflection is not served unless `security.reflection`.
        health = health_pb2_grpc.HealthStub(dial("operator"))
        reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflect = reflection_pb2_grpc.ServerReflectionStub(dial("operator"))
        ask = reflection_pb2.ServerReflectionRequest(list_services="")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in reflect.ServerReflectionInfo(iter([ask]), timeout=10):
                pass
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED

        await refused_without_credentials(mode, address, tls_folder, tmp_path)
    finally:
        for channel in channels:
            await channel.close()
        await trainer.stop()


async def refused_without_credentials(
    mode: str, address: str, tls_folder: Path, tmp_path: Path
) -> None:
    """Plaintext, TLS without identity, a forged token, another CA's 'orchestrator'."""
    status = common_pb2.StatusRequest()
    async with grpc.aio.insecure_channel(address) as plain:
        code = await code_of(trainer_grpc.TrainerServiceStub(plain).GetStatus(status, timeout=5))
        assert code == grpc.StatusCode.UNAVAILABLE
    ca = (tls_folder / "ca.pem").read_bytes()
    async with grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(ca)) as anonymous:
        stub = trainer_grpc.TrainerServiceStub(anonymous)
        code = await code_of(stub.GetStatus(status, timeout=5))
        # mTLS: the handshake itself fails; token mode: TLS works, the call has no token.
        assert code == (
            grpc.StatusCode.UNAVAILABLE if mode == "mtls" else grpc.StatusCode.UNAUTHENTICATED
        )
        assert await code_of(stub.Train(request(2), timeout=5)) != grpc.StatusCode.OK
    if mode == "token":
        forged = grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials(ca),
            grpc.access_token_call_credentials("orchestrator.not-the-real-secret"),
        )
        async with grpc.aio.secure_channel(address, forged) as channel:
            code = await code_of(trainer_grpc.TrainerServiceStub(channel).Train(request(2)))
            assert code == grpc.StatusCode.UNAUTHENTICATED
    else:
        other = tmp_path / "other-ca"
        ensure_certificates(other, roles=("orchestrator",))
        credentials = role_security(other, "orchestrator").channel_credentials()
        assert credentials is not None
        options = [("grpc.ssl_target_name_override", "localhost")]
        async with grpc.aio.secure_channel(address, credentials, options=options) as channel:
            code = await code_of(trainer_grpc.TrainerServiceStub(channel).Train(request(2)))
            assert code == grpc.StatusCode.UNAVAILABLE


def test_plaintext_is_refused_off_loopback() -> None:
    with pytest.raises(ValueError, match="without TLS"):
        GrpcServer("0.0.0.0:0", [], GrpcConfig(), security=PLAINTEXT_LOOPBACK)
    with pytest.raises(ValueError, match="without TLS"):
        make_channel("10.1.2.3:50051", security=PLAINTEXT_LOOPBACK)
    with pytest.raises(ValueError, match=r"grpc.bind_host = '0.0.0.0' is not loopback"):
        TrainerRunConfig.model_validate(
            {"security": {"mode": "plaintext"}, "grpc": {"bind_host": "0.0.0.0"}}
        )
    with pytest.raises(ValueError, match=r"endpoints.inference = 'inference:50052'"):
        TrainerRunConfig.model_validate(
            {"security": {"mode": "plaintext"}, "endpoints": {"inference": "inference:50052"}}
        )
    replicas = {"inference_replicas": ["127.0.0.1:50052", "10.0.0.7:50052"]}
    with pytest.raises(ValueError, match=r"endpoints.inference_replicas\[1\] = '10.0.0.7:50052'"):
        TrainerRunConfig.model_validate({"security": {"mode": "plaintext"}, "endpoints": replicas})


def test_missing_certificates_name_the_key_and_the_fix(tmp_path: Path) -> None:
    config = TrainerRunConfig.model_validate({"run": {"output_dir": str(tmp_path)}})
    with pytest.raises(ConfigError, match=r"security.ca_cert: cannot read .*tidal certs --out"):
        TransportSecurity.from_config(config.security, "trainer", config.run.dir)
