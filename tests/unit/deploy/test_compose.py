"""deploy/compose.yaml and the four Dockerfiles, checked statically (no engine needed).

`make test-deploy` (tests/deploy/) builds and runs them for real; this keeps the cheap
invariants in `make test`: every service's container is there, health-gated, mTLS with
certificates naming each container, loopback-only ports, a restart policy, a valid run
config in its environment, and images that install only their own wheel, as a non-root
user, with a HEALTHCHECK that probes the port the service serves.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from tidal.cli.config import RunConfig
from tidal.common.config.loading import ParsedArgs, compose, validate

from ...deploy.engine import compose_command

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
CORE = ("weightsync", "trainer", "inference-0", "inference-1", "orchestrator")
PORTS = {"orchestrator": 50051, "inference": 50052, "trainer": 50053, "weightsync": 50054}


def load_compose() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def _interpolate(value: str) -> str:
    """Compose's `${VAR:-default}` with every variable unset."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def _run_config(env: dict[str, str]) -> RunConfig:
    env = {k: _interpolate(v) for k, v in env.items()}
    return validate(
        RunConfig, compose(RunConfig, ParsedArgs(files=[ROOT / "configs/default.toml"]), env)
    )


def _role(service: str) -> str:
    return service.split("-")[0]


def test_services_and_optional_profiles() -> None:
    services = load_compose()["services"]
    core = {name for name, spec in services.items() if "profiles" not in spec}
    assert core == {*CORE, "certs"}
    assert services["inference-gpu"]["profiles"] == ["gpu"]
    assert services["otel-collector"]["profiles"] == services["jaeger"]["profiles"]
    assert services["jaeger"]["profiles"] == ["observability"]


def test_start_order_is_health_gated_and_restarts_are_set() -> None:
    services = load_compose()["services"]
    for name in CORE:
        spec = services[name]
        deps = dict(spec["depends_on"])
        assert deps.pop("certs") == {"condition": "service_completed_successfully"}
        assert all(d == {"condition": "service_healthy"} for d in deps.values()), name
        assert spec["restart"] in ("unless-stopped", "on-failure"), name
        assert "otel-collector" not in deps  # optional: traces go to the run folder
    assert set(services["orchestrator"]["depends_on"]) == {"certs", *CORE} - {"orchestrator"}
    assert services["orchestrator"]["restart"] == "on-failure"  # exits 0 when the run ends
    # A restarted trainer or orchestrator continues the run, as under tidal rl's supervisor.
    assert services["trainer"]["command"][-1] == "--resume"
    assert services["orchestrator"]["environment"]["TIDAL_ORCHESTRATOR__RESUME"] == "true"


def test_ports_are_loopback_only_and_certificates_name_every_container() -> None:
    services = load_compose()["services"]
    hosts = services["certs"]["command"][services["certs"]["command"].index("--hosts") + 1]
    assert set(hosts.split(",")) == set(CORE)
    published = []
    for name, spec in services.items():
        for port in spec.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
            published.append(port.split(":")[1])
    assert len(published) == len(set(published))
    for name in CORE:
        assert str(PORTS[_role(name)] + 1000) in services[name]["expose"]  # metrics port


def test_container_environment_is_a_valid_run_config() -> None:
    spec = load_compose()
    config = _run_config(spec["x-tidal-env"])
    assert config.grpc.listen_address(config.endpoints.trainer) == "0.0.0.0:50053"
    assert config.security.mode == "mtls"  # bind 0.0.0.0: TLS required
    assert config.security.folder(config.run.dir) == Path("/tls")
    assert not config.telemetry.otlp_endpoint  # unless TIDAL_OTLP_ENDPOINT is set
    assert config.telemetry.traces_file
    replicas = [n for n in CORE if n.startswith("inference-")]
    assert config.endpoints.inference_addresses() == [f"{n}:50052" for n in replicas]
    ids = [spec["services"][n]["environment"]["TIDAL_INFERENCE__REPLICA_ID"] for n in replicas]
    assert ids == replicas


def test_client_config_reaches_every_published_port() -> None:
    client = tomllib.loads((DEPLOY / "client.toml").read_text())["endpoints"]
    services = load_compose()["services"]
    published = {
        name: port.split(":")[1] for name in CORE for port in services[name].get("ports", [])
    }
    addresses = {client[n] for n in ("orchestrator", "trainer", "weightsync")}
    addresses |= set(client["inference_replicas"])
    assert addresses == {f"127.0.0.1:{p}" for p in published.values()}


@pytest.mark.parametrize("service", list(PORTS))
def test_dockerfile_installs_its_wheel_as_a_non_root_user_with_a_healthcheck(
    service: str,
) -> None:
    text = (DEPLOY / "docker" / f"{service}.Dockerfile").read_text()
    assert text.count("ARG BASE_IMAGE=python:3.11-slim") == 1
    installs = re.findall(r'--find-links /wheels "(tidal-[a-z]+)', text)
    assert installs == [f"tidal-{service}"]  # only its own wheel: inference has no trainer
    assert "\nUSER tidal\n" in text
    probe = re.search(r"HEALTHCHECK .*\n\s+CMD (\[.*\])", text)
    assert probe is not None
    argv = yaml.safe_load(probe.group(1))
    assert argv[:3] == ["python", "-m", "tidal.common.grpc.health_probe"]
    assert argv[argv.index("--address") + 1] == f"127.0.0.1:{PORTS[service]}"
    assert argv[argv.index("--role") + 1] == service
    assert f'ENTRYPOINT ["python", "-m", "tidal.{service}"]' in text


@pytest.mark.parametrize("service", ["orchestrator", "weightsync"])
def test_torch_free_services_declare_no_torch(service: str) -> None:
    """The closure of the service's declared dependencies over this repo's packages."""
    projects = {
        tomllib.loads(p.read_text())["project"]["name"]: tomllib.loads(p.read_text())["project"]
        for p in [*ROOT.glob("libs/*/pyproject.toml"), *ROOT.glob("services/*/pyproject.toml")]
    }
    seen, todo = set(), [f"tidal-{service}"]
    while todo:
        name = todo.pop()
        seen.add(name)
        for dep in projects[name]["dependencies"]:
            dep_name = re.split(r"[<>=\[ ]", dep)[0]
            assert dep_name != "torch", f"{name} depends on torch"
            if dep_name in projects and dep_name not in seen:
                todo.append(dep_name)


def test_compose_file_validates_with_compose_binary() -> None:
    command = compose_command()
    if command is None:
        pytest.skip("no docker-compose binary or docker compose plugin on this machine")
    for profile in ([], ["--profile", "gpu", "--profile", "observability"]):
        result = subprocess.run(
            [*command, "-f", str(DEPLOY / "compose.yaml"), *profile, "config", "--quiet"],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr
