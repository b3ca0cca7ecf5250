"""Shared by the deploy/k8s tests: constants, and lookups into the rendered objects.

The fixtures that render the overlays are in this folder's conftest.py.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from tidal.common.config.shared import SERVICES, Endpoints, ServiceRunConfig, SharedConfig
from tidal.common.security.authz import ANY_ROLE, POLICY
from tidal.inference.config import InferenceRunConfig
from tidal.orchestrator.config import OrchestratorRunConfig
from tidal.trainer.config import TrainerRunConfig
from tidal.weightsync.config import WeightSyncRunConfig

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
    """`metrics.port_offset`'s default."""
    metrics = SharedConfig().metrics
    assert metrics.enabled and getattr(metrics, "port", None) is None  # the offset applies
    return int(metrics.port_offset)


def callers_by_authz() -> dict[str, set[str]]:
    """Roles that may open a connection to each service, from authz.POLICY: those a method
    of the service names, plus `operator` for every service serving a read (ANY_ROLE). The
    services' own reads follow these edges: the orchestrator reads inference's and the
    trainer's GetStatus, and weightsync's readers (tidal.weights.client) are its callers."""
    callers: dict[str, set[str]] = {role: set() for role in SERVICES}
    for method, roles in POLICY.items():
        service = method.split("/")[1].rsplit(".", 1)[1].removesuffix("Service").lower()
        callers[service] |= {"operator"} if roles == ANY_ROLE else set(roles)
    return callers


def secret_files(objects: list[Obj], name: str) -> dict[str, bytes]:
    data = find(objects, "Secret", name)["data"]
    return {key: base64.b64decode(value) for key, value in data.items()}
