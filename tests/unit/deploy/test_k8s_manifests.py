"""deploy/k8s: the rendered manifests are valid Kubernetes objects that run what the code serves.

No cluster runs here. Each overlay is rendered (`kustomize_lite`, which says why not the
kustomize binary; where `kubectl` is installed, its built-in kustomize must render the same
objects) from a copy of deploy/k8s whose TLS secrets were made by the real
`deploy/k8s/make-certs.sh`, every object is validated against the Kubernetes JSON schemas
of `K8S_VERSION` (kubernetes-validate, strict: unknown fields are errors), and the
manifests are compared with the code they deploy: ports and probes with the config
defaults, each container's environment with its service's config class, the replica list
with the StatefulSet, the NetworkPolicy with `tidal.common.security.authz.POLICY`. The TLS Secrets
are checked in test_k8s_tls.py.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tidal.common.config.loading import load_config
from tidal.common.config.shared import SERVICES
from tidal.common.security.config import is_loopback
from tidal.common.security.credentials import ROLES
from tidal.orchestrator.config import OrchestratorRunConfig
from tidal.trainer.config import TrainerRunConfig
from tidal.weightsync.config import WeightSyncRunConfig

from .k8s_render import (
    COMPONENT,
    K8S,
    K8S_VERSION,
    OVERLAYS,
    ROOT,
    RUN_CONFIGS,
    Obj,
    callers_by_authz,
    container,
    environment,
    find,
    grpc_port,
    metrics_offset,
    workload,
)


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
    probe = ["python", "-m", "tidal.common.grpc.health_probe", "--address", address, "--role", role]
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
    # Metrics are HTTPS off loopback (tidal.common.observability.prometheus), and the pods bind
    # 0.0.0.0.
    bind_host = find(objects, "ConfigMap", "tidal-env")["data"]["TIDAL_GRPC__BIND_HOST"]
    assert not is_loopback(bind_host) and annotations["prometheus.io/scheme"] == "https"


def test_the_probe_command_exists() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tidal.common.grpc.health_probe", "--help"],
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
    callers = callers_by_authz()
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
