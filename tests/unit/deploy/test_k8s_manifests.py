"""deploy/k8s: the rendered manifests are valid Kubernetes objects that run what the code serves.

No cluster runs here. Each overlay is rendered (`kustomize_lite`, which says why not the
kustomize binary; where `kubectl` is installed, its built-in kustomize must render the same
objects) from a copy of deploy/k8s whose TLS secrets were made by the real
`deploy/k8s/make-certs.sh`, every object is validated against the Kubernetes JSON schemas
of `K8S_VERSION` (kubernetes-validate, strict: unknown fields are errors), and the
manifests are compared with the code they deploy: ports and probes with the config
defaults, each container's environment with its service's config class, the replica list
with the StatefulSet, the NetworkPolicy with `tidal.common.authz.POLICY`, the certificates'
names with the addresses dialled.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from tidal.common.authz import ANY_ROLE, POLICY
from tidal.common.certs import ROLES, role_of_certificate
from tidal.common.config import load_config
from tidal.common.sections import SERVICES, Endpoints, ServiceRunConfig, SharedConfig
from tidal.common.security import TransportSecurity
from tidal.common.security_config import SecurityConfig, is_loopback
from tidal.inference.config import InferenceRunConfig
from tidal.orchestrator.config import OrchestratorRunConfig
from tidal.trainer.config import TrainerRunConfig
from tidal.weightsync.config import WeightSyncRunConfig

from .kustomize_lite import render

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
K8S_VERSION = "1.31.0"
"""Kubernetes release whose schemas the objects must satisfy (the oldest still supported
upstream when this was written; nothing used here is newer)."""
OVERLAYS = ("cpu", "gpu")
RUN_CONFIGS: dict[str, type[ServiceRunConfig]] = {
    "orchestrator": OrchestratorRunConfig,
    "inference": InferenceRunConfig,
    "trainer": TrainerRunConfig,
    "weightsync": WeightSyncRunConfig,
}
POD_KINDS = ("Deployment", "StatefulSet")
COMPONENT = "app.kubernetes.io/component"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of deploy/k8s with certificates from make-certs.sh, as a user makes them."""
    tree = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("tls"))
    env = {**os.environ, "PYTHON": sys.executable}
    made = subprocess.run(
        ["bash", str(tree / "make-certs.sh")], env=env, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    return tree


@pytest.fixture(scope="module")
def rendered(tree: Path) -> dict[str, list[Obj]]:
    return {name: render(tree / "overlays" / name) for name in OVERLAYS}


def find(objects: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def workload(objects: list[Obj], role: str) -> Obj:
    found = [
        o
        for o in objects
        if o["kind"] in POD_KINDS and o["spec"]["template"]["metadata"]["labels"][COMPONENT] == role
    ]
    assert len(found) == 1, role
    return found[0]


def container(objects: list[Obj], role: str) -> Obj:
    containers = workload(objects, role)["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == [role]
    return containers[0]


def environment(objects: list[Obj], role: str) -> dict[str, str]:
    """The TIDAL_ variables the role's container sees (envFrom ConfigMaps, then env)."""
    spec = container(objects, role)
    env: dict[str, str] = {}
    for source in spec.get("envFrom", []):
        env.update(find(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
    for var in spec.get("env", []):
        env[var["name"]] = var.get("value", f"<from {var.get('valueFrom')}>")
    return env


def grpc_port(role: str) -> int:
    return int(getattr(Endpoints(), role).rsplit(":", 1)[1])


def metrics_offset() -> int:
    """`metrics.port_offset`'s default once the [metrics] section exists; until then the
    value issue 18's shared interface fixes (1000)."""
    metrics = getattr(SharedConfig(), "metrics", None)
    if metrics is None:
        return 1000
    assert metrics.enabled and getattr(metrics, "port", None) is None  # the offset applies
    return int(metrics.port_offset)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schemas(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    objects = rendered[overlay]
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "StatefulSet", "Service", "PersistentVolumeClaim"} <= kinds
    assert {"NetworkPolicy", "ConfigMap", "Secret", "Namespace"} <= kinds
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "tidal", obj["metadata"]["name"]


def _comparable(objects: list[Obj]) -> dict[tuple[str, str], Obj]:
    """Objects by (kind, name), Secret data decoded (kustomize wraps its base64 lines)."""
    out = {}
    for obj in objects:
        if obj["kind"] == "Secret":
            obj = {**obj, "data": {k: base64.b64decode(v) for k, v in obj["data"].items()}}
        out[obj["kind"], obj["metadata"]["name"]] = obj
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kubectl_kustomize_renders_the_same_objects_where_installed(
    tree: Path, rendered: dict[str, list[Obj]], overlay: str
) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl here: the manifests are rendered by kustomize_lite only")
    result = subprocess.run(
        [kubectl, "kustomize", str(tree / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    real = [o for o in yaml.safe_load_all(result.stdout) if o is not None]
    assert _comparable(real) == _comparable(rendered[overlay])


def test_the_config_map_carries_the_default_run_config(rendered: dict[str, list[Obj]]) -> None:
    assert (K8S / "base/default.toml").read_text() == (ROOT / "configs/default.toml").read_text()
    config = find(rendered["cpu"], "ConfigMap", "tidal-config")
    assert config["data"]["default.toml"] == (ROOT / "configs/default.toml").read_text()


@pytest.mark.parametrize("role", SERVICES)
def test_ports_probes_and_scrape_annotations_match_the_config_defaults(
    rendered: dict[str, list[Obj]], role: str
) -> None:
    objects = rendered["cpu"]
    port, metrics = grpc_port(role), grpc_port(role) + metrics_offset()
    spec = container(objects, role)
    assert spec["ports"] == [
        {"name": "grpc", "containerPort": port, "protocol": "TCP"},
        {"name": "metrics", "containerPort": metrics, "protocol": "TCP"},
    ]
    address = f"127.0.0.1:{port}"
    probe = ["python", "-m", "tidal.common.healthcheck", "--address", address, "--role", role]
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert spec[kind]["exec"]["command"] == probe, kind
    service = find(objects, "Service", role)
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [
        ("grpc", port),
        ("metrics", metrics),
    ]
    assert (
        service["spec"]["selector"].items()
        <= workload(objects, role)["spec"]["template"]["metadata"]["labels"].items()
    )
    annotations = workload(objects, role)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(metrics)
    assert annotations["prometheus.io/path"] == "/metrics"
    # Metrics are HTTPS off loopback (tidal.common.metrics), and the pods bind 0.0.0.0.
    bind_host = find(objects, "ConfigMap", "tidal-env")["data"]["TIDAL_GRPC__BIND_HOST"]
    assert not is_loopback(bind_host) and annotations["prometheus.io/scheme"] == "https"


def test_the_probe_command_exists_once_the_healthcheck_module_lands() -> None:
    if importlib.util.find_spec("tidal.common.healthcheck") is None:
        pytest.skip("tidal.common.healthcheck (issue 18, docker helper) is not on this branch")
    result = subprocess.run(
        [sys.executable, "-m", "tidal.common.healthcheck", "--help"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "--address" in result.stdout and "--role" in result.stdout


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("role", SERVICES)
def test_each_container_environment_is_a_valid_config_of_its_service(
    rendered: dict[str, list[Obj]], overlay: str, role: str, tmp_path: Path
) -> None:
    objects = rendered[overlay]
    spec = container(objects, role)
    (tmp_path / "default.toml").write_text(
        find(objects, "ConfigMap", "tidal-config")["data"]["default.toml"]
    )
    mount = next(m for m in spec["volumeMounts"] if m["name"] == "config")["mountPath"]
    assert spec["command"] == ["python", "-m", f"tidal.{role}"]
    argv = [a.replace(mount, str(tmp_path)) for a in spec["args"]]
    config, _ = load_config(RUN_CONFIGS[role], argv, environ=environment(objects, role))
    assert config.grpc.listen_address(getattr(config.endpoints, role)) == (
        f"0.0.0.0:{grpc_port(role)}"
    )
    assert config.security.mode == "mtls"
    mounts = {m["mountPath"]: m for m in spec["volumeMounts"]}
    assert mounts[str(config.security.tls_dir)]["readOnly"] is True
    # Everything the service writes lies on a volume (the root filesystem is read-only).
    assert config.run.dir.is_relative_to("/shared") and "/shared" in mounts
    if role == "trainer":
        assert isinstance(config, TrainerRunConfig)
        assert config.resume  # a restarted container continues from its checkpoint
        assert str(config.checkpoint_dir) in mounts
        claims = workload(objects, role)["spec"]["volumeClaimTemplates"]
        assert mounts[str(config.checkpoint_dir)]["name"] in [c["metadata"]["name"] for c in claims]
        assert config.publish_dir.is_relative_to("/shared")
    if role == "orchestrator":
        assert isinstance(config, OrchestratorRunConfig)
        assert config.orchestrator.resume and not config.orchestrator.exit_when_done
    if role == "weightsync":
        assert isinstance(config, WeightSyncRunConfig)
        assert config.weights_root.is_relative_to("/shared")


def test_the_orchestrator_lists_every_inference_replica_by_its_stable_name(
    rendered: dict[str, list[Obj]],
) -> None:
    objects = rendered["cpu"]
    inference = workload(objects, "inference")
    assert inference["kind"] == "StatefulSet"
    headless = find(objects, "Service", inference["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    env = environment(objects, "orchestrator")
    replicas = json.loads(env["TIDAL_ENDPOINTS__INFERENCE_REPLICAS"])
    name, service = inference["metadata"]["name"], headless["metadata"]["name"]
    assert replicas == [
        f"{name}-{i}.{service}:{grpc_port('inference')}"
        for i in range(inference["spec"]["replicas"])
    ]
    assert inference["spec"]["replicas"] == 2
    # Each replica registers with weightsync under its pod name (inference-<i>).
    replica_id = next(
        v
        for v in container(objects, "inference")["env"]
        if v["name"] == "TIDAL_INFERENCE__REPLICA_ID"
    )
    assert replica_id["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    orchestrator = workload(objects, "orchestrator")
    assert orchestrator["kind"] == "Deployment" and orchestrator["spec"]["replicas"] == 1
    assert workload(objects, "trainer")["kind"] == "StatefulSet"


def _callers_by_authz() -> dict[str, set[str]]:
    """Roles that may open a connection to each service, from authz.POLICY: those a method
    of the service names, plus `operator` for every service serving a read (ANY_ROLE). The
    services' own reads follow these edges: the orchestrator reads inference's and the
    trainer's GetStatus, and weightsync's readers (tidal.weights.client) are its callers."""
    callers: dict[str, set[str]] = {role: set() for role in SERVICES}
    for method, roles in POLICY.items():
        service = method.split("/")[1].rsplit(".", 1)[1].removesuffix("Service").lower()
        callers[service] |= {"operator"} if roles == ANY_ROLE else set(roles)
    return callers


def _selected_role(peer: Obj) -> str:
    labels = peer["podSelector"]["matchLabels"]
    assert labels["app.kubernetes.io/part-of"] == "tidal" and "namespaceSelector" not in peer
    return str(labels[COMPONENT])


def _policies_for(objects: list[Obj], role: str, direction: str) -> list[Obj]:
    return [
        p
        for p in objects
        if p["kind"] == "NetworkPolicy"
        and direction in p["spec"]["policyTypes"]
        and p["spec"]["podSelector"].get("matchLabels", {}).get(COMPONENT) == role
    ]


def test_network_policy_lets_each_service_reach_only_its_peers_in_authz(
    rendered: dict[str, list[Obj]],
) -> None:
    objects = rendered["cpu"]
    deny = find(objects, "NetworkPolicy", "default-deny")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    callers = _callers_by_authz()
    assert callers["weightsync"] == {"trainer", "inference", "orchestrator", "operator"}
    assert callers["orchestrator"] == {"operator"}  # it serves only reads
    callees: dict[str, set[str]] = {role: set() for role in SERVICES}
    for role in SERVICES:
        [ingress] = _policies_for(objects, role, "Ingress")
        grpc_from: set[str] = set()
        for rule in ingress["spec"]["ingress"]:
            ports = [p["port"] for p in rule["ports"]]
            if ports == ["grpc"]:
                grpc_from |= {_selected_role(peer) for peer in rule["from"]}
            else:  # the metrics port, from Prometheus only
                assert ports == ["metrics"]
                [peer] = rule["from"]
                assert peer["podSelector"]["matchLabels"] == {
                    "app.kubernetes.io/name": "prometheus"
                }
                assert peer["namespaceSelector"]["matchLabels"]
        assert grpc_from == callers[role], role
        for caller in callers[role] - {"operator"}:
            callees[caller].add(role)
    assert set(ROLES) - set(SERVICES) == {"operator"}
    for role in SERVICES:
        allowed: dict[str, int] = {}
        for policy in _policies_for(objects, role, "Egress"):
            for rule in policy["spec"]["egress"]:
                for peer in rule["to"]:
                    [port] = [p["port"] for p in rule["ports"]]
                    allowed[_selected_role(peer)] = port
        assert allowed == {callee: grpc_port(callee) for callee in callees[role]}, role
    dns = find(objects, "NetworkPolicy", "dns-egress")["spec"]
    assert dns["podSelector"]["matchLabels"] == {"app.kubernetes.io/part-of": "tidal"}
    assert {(p["protocol"], p["port"]) for p in dns["egress"][0]["ports"]} == {
        ("UDP", 53),
        ("TCP", 53),
    }


def _secret_files(objects: list[Obj], name: str) -> dict[str, bytes]:
    data = find(objects, "Secret", name)["data"]
    return {key: base64.b64decode(value) for key, value in data.items()}


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
    files = _secret_files(objects, secrets[0])
    assert set(files) == {"ca.pem", f"{role}.pem", f"{role}.key"}
    assert role_of_certificate(files[f"{role}.pem"]) == role
    cert = x509.load_pem_x509_certificate(files[f"{role}.pem"])
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns_names = set(names.get_values_for_type(x509.DNSName))
    assert set(_dialled_hosts(environment(objects, role))) <= dns_names
    assert "localhost" in dns_names  # the health probe dials 127.0.0.1 (an IP SAN, always)
    for secret in (o for o in objects if o["kind"] == "Secret"):
        assert "ca.key" not in secret["data"] and "operator.key" not in secret["data"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_run_unprivileged_with_resources_set(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    for role in SERVICES:
        pod = workload(rendered[overlay], role)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 0
        assert pod["automountServiceAccountToken"] is False
        spec = container(rendered[overlay], role)
        assert spec["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
        assert {"cpu", "memory"} <= spec["resources"]["requests"].keys()
        assert {"cpu", "memory"} <= spec["resources"]["limits"].keys()
        assert "/tmp" in {m["mountPath"] for m in spec["volumeMounts"]}
    claim = find(rendered[overlay], "PersistentVolumeClaim", "tidal-shared")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_the_gpu_overlay_adds_gpus_and_vllm_to_inference_and_the_trainer_only(
    rendered: dict[str, list[Obj]],
) -> None:
    cpu, gpu = rendered["cpu"], rendered["gpu"]
    for role in SERVICES:
        with_gpu = role in ("inference", "trainer")
        for overlay, objects in (("cpu", cpu), ("gpu", gpu)):
            resources = container(objects, role)["resources"]
            has = resources["limits"].get("nvidia.com/gpu") == "1"
            assert has == (with_gpu and overlay == "gpu"), (role, overlay)
        # The patch merged into the base container: probes, mounts and env stay.
        assert container(gpu, role)["readinessProbe"] == container(cpu, role)["readinessProbe"]
        base_env = [
            v for v in container(cpu, role).get("env", []) if "NUM_THREADS" not in v["name"]
        ]
        assert all(v in container(gpu, role).get("env", []) for v in base_env)
    assert environment(gpu, "inference")["TIDAL_INFERENCE__ENGINE"] == "vllm"
    assert environment(gpu, "trainer")["TIDAL_TRAINER__DEVICE"] == "cuda"
    assert "TIDAL_INFERENCE__ENGINE" not in environment(cpu, "inference")
    assert container(gpu, "inference")["image"] == "tidal-inference-gpu:latest"
    assert container(gpu, "trainer")["image"] == "tidal-trainer-gpu:latest"
    assert container(gpu, "orchestrator")["image"] == container(cpu, "orchestrator")["image"]


def _mounted_security(objects: list[Obj], role: str, folder: Path) -> TransportSecurity:
    """`role`'s credentials read as its service reads them, from a folder holding only
    what its pod mounts (its Secret's files)."""
    folder.mkdir()
    for name, data in _secret_files(objects, f"tidal-tls-{role}").items():
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
    for callee, callers in _callers_by_authz().items():
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
