"""deploy/compose.yaml: one container per service, valid config env, buildable Dockerfiles.

There is no Docker engine on the CI machines; the compose file is validated with a
compose binary when one exists, and checked statically always.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tidal.cli.config import RunConfig
from tidal.common.config import ParsedArgs, compose, validate

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
SERVICES = ("orchestrator", "inference", "trainer", "weightsync")


def load_compose() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_every_service_has_a_container_plus_collector_and_jaeger() -> None:
    services = load_compose()["services"]
    assert set(services) == {*SERVICES, "certs", "otel-collector", "jaeger"}


def test_services_run_mtls_with_the_generated_certificates_on_loopback_ports() -> None:
    services = load_compose()["services"]
    assert services["certs"]["entrypoint"][-1] == "tidal.common.make_certs"
    assert importlib.util.find_spec("tidal.common.make_certs") is not None
    for name in SERVICES:
        spec = services[name]
        assert spec["depends_on"]["certs"] == {"condition": "service_completed_successfully"}
        assert all(port.startswith("127.0.0.1:") for port in spec.get("ports", []))


@pytest.mark.parametrize("service", SERVICES)
def test_dockerfile_copies_existing_packages_and_runs_the_service(service: str) -> None:
    spec = load_compose()["services"][service]
    dockerfile = ROOT / spec["build"]["dockerfile"]
    text = dockerfile.read_text()
    for line in text.splitlines():
        if line.startswith("COPY "):
            assert (ROOT / line.split()[1] / "pyproject.toml").is_file(), line
    assert f'"tidal.{service}"' in text
    assert importlib.util.find_spec(f"tidal.{service}.service") is not None
    assert (service in ("trainer", "inference")) == ("torch==2.13.0" in text)


def test_container_environment_is_a_valid_run_config() -> None:
    env = load_compose()["x-tidal-env"]
    config = validate(
        RunConfig, compose(RunConfig, ParsedArgs(files=[ROOT / "configs/default.toml"]), env)
    )
    assert config.endpoints.trainer == "trainer:50053"
    assert config.grpc.listen_address(config.endpoints.trainer) == "0.0.0.0:50053"
    assert config.telemetry.otlp_endpoint == "otel-collector:4317"
    assert config.security.mode == "mtls"  # bind 0.0.0.0: TLS required
    assert config.security.folder(config.run.dir) == Path("/shared/tls")


def test_orchestrator_lists_every_inference_replica() -> None:
    spec = load_compose()
    replicas = spec["services"]["inference"]["deploy"]["replicas"]
    env = spec["x-tidal-env"]
    config = validate(
        RunConfig, compose(RunConfig, ParsedArgs(files=[ROOT / "configs/default.toml"]), env)
    )
    assert config.endpoints.inference_addresses() == [
        f"tidal-inference-{i}:50052" for i in range(1, replicas + 1)
    ]
    assert "ports" not in spec["services"]["inference"]  # N replicas cannot share a host port


def _compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


def test_compose_file_validates_with_compose_binary() -> None:
    command = _compose_command()
    if command is None:
        pytest.skip("no docker-compose binary or docker compose plugin on this machine")
    result = subprocess.run(
        [*command, "-f", str(DEPLOY / "compose.yaml"), "config", "--quiet"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("service", ["trainer", "inference"])
def test_images_with_a_model_install_the_model_library(service: str) -> None:
    text = (DEPLOY / "docker" / f"{service}.Dockerfile").read_text()
    assert "COPY libs/models " in text and "/app/libs/models" in text


def test_the_inference_image_does_not_install_the_trainer() -> None:
    text = (DEPLOY / "docker" / "inference.Dockerfile").read_text()
    assert "services/trainer" not in text
