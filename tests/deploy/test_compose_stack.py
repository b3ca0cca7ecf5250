"""`make test-deploy`: the compose stack built and run on a real Docker engine.

One test, in order (each step's failure names it): a Docker engine (installed and started
when none answers: engine.py); the offline base image (deploy/base-image.sh); the four
images from dist/ (make test-deploy runs `make wheelhouse` first); `compose up` of
deploy/compose.yaml with the default config (configs/default.toml with DEFAULT_STEPS RL
steps, or TIDAL_DEPLOY_STEPS=N), which starts the orchestrator only once the other four
containers are healthy (the images' HEALTHCHECK: tidal.common.grpc.health_probe over mTLS); one
inference replica killed (`docker kill`) as soon as the RL phase is under way; `tidal
client status` from the host answered by the four live services; the orchestrator's own
HEALTHCHECK seen passing; the run finishes (orchestrator exits 0) with every RL step done
and reward rising, read from the run folder on the host (the bind mount); the services
still healthy; the killed replica started again and healthy (it rejoins at the newest
version); a crash of inference-0's server process restarted by its restart policy (a
`docker kill` is a manual stop, which Docker does not restart) and healthy again; then
`compose down -v`. The images and this build's stages stay as the build cache, so an
unchanged tree's next run builds in seconds; the untagged images of earlier builds (by our
labels) are pruned after each build. The stack folder is removed when the test passes and
kept for reading when it fails. Wall time and image sizes are printed
at the end.

Marked `deploy`: `make test` leaves it out (`-m "not gpu and not deploy and not cluster"`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import tomli_w

from tidal.orchestrator.records.run_log import run_log_records

from .engine import compose_command, container_state, ensure_engine, image_size_mb, sh

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "tidaldeploytest"
SERVICES = ("weightsync", "trainer", "inference-0", "inference-1", "orchestrator")
IMAGES = ("tidal-orchestrator", "tidal-inference", "tidal-trainer", "tidal-weightsync")
BASE_IMAGE = os.environ.get("BASE_IMAGE", "tidal-base:bookworm")
RUN_TIMEOUT_S = float(os.environ.get("TIDAL_DEPLOY_RUN_TIMEOUT_S", "1800"))
WINDOW = 5
LEARNING_BAR = 0.3  # as the local default run's test (tests/integration/test_default_run.py)
DEFAULT_STEPS = 150
"""RL steps of the test's run (the default config has 60). The checks after the kill need the
orchestrator still running: a quiet machine runs 60 steps in ~20 s, less than the time
to Docker's first health probe of the orchestrator (10 s after its start) plus compose's
own start-up, and a CI run once lost that race. 150 steps hold the run open ~50 s."""

# The whole build-run-teardown; pyproject's 300 s per-test cap is for the suite.
pytestmark = [pytest.mark.deploy, pytest.mark.timeout(int(RUN_TIMEOUT_S) + 3600)]


class Stack:
    """`compose -p tidaldeploytest -f deploy/compose.yaml ...` with the test's environment."""

    def __init__(self, stack_dir: Path, log: Path) -> None:
        command = compose_command()
        assert command is not None, "no compose after ensure_engine"
        self.base = [*command, "-p", PROJECT, "-f", str(ROOT / "deploy" / "compose.yaml")]
        self.dir = stack_dir
        self.log = log
        self.env = {
            **os.environ,
            "STACK_DIR": str(stack_dir),
            "BASE_IMAGE": BASE_IMAGE,
            "TIDAL_UID": "10001",
            "TIDAL_GID": "10001",
            "TIDAL_CONFIG_DIR": str(stack_dir / "configs"),
            "TIDAL_CONFIG": "run.toml",
        }

    def __call__(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return sh([*self.base, *args], env=self.env, timeout=timeout, log=self.log)

    def container(self, service: str) -> str:
        out = sh([*self.base, "ps", "-q", service], env=self.env).stdout.strip()
        assert out, f"no container for {service}"
        return out.splitlines()[0]


def _write_config(stack_dir: Path) -> dict:  # type: ignore[type-arg]
    """configs/default.toml, with orchestrator.steps = TIDAL_DEPLOY_STEPS or DEFAULT_STEPS."""
    config = tomllib.loads((ROOT / "configs" / "default.toml").read_text())
    config["orchestrator"]["steps"] = int(os.environ.get("TIDAL_DEPLOY_STEPS", DEFAULT_STEPS))
    folder = stack_dir / "configs"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.toml").write_text(tomli_w.dumps(config))
    return config


def _metrics(run_dir: Path) -> list[dict]:  # type: ignore[type-arg]
    return run_log_records(run_dir / "metrics.jsonl")


def _wait(what: str, predicate, timeout_s: float, every_s: float = 2.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(every_s)


# Run inside an inference container: SIGKILL its server process (PID 1 is the init, tini).
CRASH_SERVICE = """
import os, signal
for pid in filter(str.isdigit, os.listdir("/proc")):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        if f.read().startswith(b"python\\0-m\\0tidal.inference\\0"):
            os.kill(int(pid), signal.SIGKILL)
"""


def _restarts(container: str) -> int:
    return int(sh(["docker", "inspect", "--format", "{{.RestartCount}}", container]).stdout)


def _health(stack: Stack, service: str) -> str:
    state = container_state(stack.container(service))
    return state.get("Health", {}).get("Status", state["Status"])


def _probe_passed(container: str) -> bool:
    """Docker's HEALTHCHECK has passed at least once (its log keeps the last five probes)."""
    health = container_state(container).get("Health", {})
    return health.get("Status") == "healthy" or any(
        probe.get("ExitCode") == 0 for probe in health.get("Log") or []
    )


def _status_mid_run(stack_dir: Path) -> str:
    """`tidal client status` from the host, mid-run: the four live services (the killed
    replica left out). Retried briefly: the orchestrator may be between two RPCs."""
    client = ["client", "status", "@", str(ROOT / "deploy" / "client.toml")]
    client += ["--security.tls_dir", str(stack_dir / "tls")]
    client += ["--endpoints.inference_replicas", '["127.0.0.1:50052"]']
    for _ in range(5):
        status = subprocess.run(
            [sys.executable, "-m", "tidal.cli", *client],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "200"},
        )
        if status.returncode == 0 and status.stdout.count("SERVING") == 4:
            return status.stdout
        time.sleep(1)
    raise AssertionError(f"tidal client status mid-run:\n{status.stdout}{status.stderr}")


def _print_health(stack: Stack) -> None:
    """Each container's state and last probes, for a failed run's output."""
    for service in SERVICES:
        with contextlib.suppress(Exception):
            state = container_state(stack.container(service))
            print(f"test-deploy: {service}: {json.dumps(state, indent=None)[:2000]}")


def _prune_superseded(*, before: float, log: Path) -> None:
    """Remove what earlier builds left untagged: service images a new build replaced, and
    build stages older than this build (a stage reused as cache this time goes too, and the
    next build installs it again). Ours alone: `image prune` takes only untagged images,
    and only those carrying our labels; without it every changed build leaves ~8 GB."""
    for label in ("org.tidal.image=true", "org.tidal.build-stage=true"):
        sh(
            [
                "docker",
                "image",
                "prune",
                "-f",
                "--filter",
                f"label={label}",
                "--filter",
                f"until={int(before)}",
            ],
            log=log,
        )


def test_compose_stack_runs_the_default_config_through_a_replica_kill() -> None:
    started = time.monotonic()
    timings: dict[str, float] = {}
    stack_dir = ROOT / "outputs" / "test-deploy"
    if stack_dir.exists():  # the previous failed run's folder, kept for reading
        shutil.rmtree(stack_dir)
    stack_dir.mkdir(parents=True)
    log = stack_dir / "test-deploy.log"
    print(f"\ntest-deploy: log {log}", flush=True)

    print(f"test-deploy: engine: {ensure_engine(log)}", flush=True)
    sh([str(ROOT / "deploy" / "base-image.sh")], log=log, timeout=1800)
    sh([str(ROOT / "deploy" / "stack-dir.sh"), str(stack_dir)], log=log)
    config = _write_config(stack_dir)
    steps = config["orchestrator"]["steps"]  # RL steps; the warm-up steps come first
    run_dir = stack_dir / "outputs" / config["run"]["name"]
    stack = Stack(stack_dir, log)
    timings["engine+base"] = time.monotonic() - started

    t = time.monotonic()
    built_after = time.time()
    stack("build", timeout=3600)
    timings["build"] = time.monotonic() - t
    _prune_superseded(before=built_after, log=log)
    passed = False
    try:
        t = time.monotonic()
        # compose returns once the orchestrator is started, which it does only when the
        # other four are healthy (service_healthy); the run begins at once.
        stack("up", "-d", timeout=900)
        for service in SERVICES[:-1]:
            assert _health(stack, service) == "healthy", service

        def rl_steps() -> int:
            return sum(m["phase"] == "rl" for m in _metrics(run_dir))

        # Kill one replica as soon as the RL phase is under way (a run on a quiet machine
        # takes well under a minute, so everything else waits until after the kill).
        victim = stack.container("inference-1")
        _wait("2 RL steps in metrics.jsonl", lambda: rl_steps() >= 2, RUN_TIMEOUT_S, 0.5)
        sh(["docker", "kill", victim], log=log)
        killed_at = rl_steps()
        print(f"test-deploy: killed inference-1 at RL step {killed_at}/{steps}", flush=True)
        assert killed_at < steps, "the run ended before the kill"

        # `tidal client status` from the host (published loopback ports, the stack's
        # certificates), mid-run: the four live services, the killed replica left out.
        status = _status_mid_run(stack_dir)
        print(status, flush=True)
        assert f"/{steps + config['orchestrator']['warmup_steps']}, version" in status

        # The orchestrator's own probe: Docker runs it 10 s after the container's start.
        orchestrator = stack.container("orchestrator")
        _wait("the orchestrator's HEALTHCHECK to pass", lambda: _probe_passed(orchestrator), 120, 1)
        timings["up+healthy"] = time.monotonic() - t
        print(f"test-deploy: all five containers healthy after {timings['up+healthy']:.0f}s")

        _wait(
            "the orchestrator to exit",
            lambda: container_state(orchestrator)["Status"] == "exited",
            RUN_TIMEOUT_S,
            every_s=2,
        )
        state = container_state(orchestrator)
        assert state["ExitCode"] == 0, f"orchestrator exited {state['ExitCode']}"
        timings["run"] = time.monotonic() - t

        metrics = _metrics(run_dir)
        rl = [m["reward_mean"] for m in metrics if m["phase"] == "rl"]
        assert len(rl) == steps, f"{len(rl)} RL steps of {steps}"  # warm-up steps come first
        first, last = sum(rl[:WINDOW]) / WINDOW, sum(rl[-WINDOW:]) / WINDOW
        print(f"test-deploy: reward {first:.3f} (first {WINDOW}) -> {last:.3f} (last {WINDOW})")
        assert last - first >= LEARNING_BAR, f"reward {first:.3f} -> {last:.3f}"
        for name in ("reward.png", "traces.jsonl", "progress.json"):  # config.toml: tidal rl only
            assert (run_dir / name).stat().st_size > 0, name
        for service in ("weightsync", "trainer", "inference-0"):
            assert _health(stack, service) == "healthy", service

        # The killed replica, started again, rejoins: it loads the newest version.
        assert container_state(victim)["Status"] == "exited"  # a manual stop stays stopped
        sh(["docker", "start", victim], log=log)
        _wait("inference-1 healthy again", lambda: _health(stack, "inference-1") == "healthy", 300)

        # `docker kill` is a manual stop, which Docker's restart policies leave stopped; a
        # crash is what they restart: SIGKILL inference-0's server process (the container's
        # init, PID 1, then exits 137) and see the container come back healthy.
        survivor = stack.container("inference-0")
        sh(["docker", "exec", survivor, "python", "-c", CRASH_SERVICE], log=log)
        _wait("inference-0 restarted", lambda: _restarts(survivor) >= 1, 120)
        _wait("inference-0 healthy again", lambda: _health(stack, "inference-0") == "healthy", 300)
        print(f"test-deploy: inference-0 crashed, restarted {_restarts(survivor)}x, healthy")
        passed = True
    finally:
        if not passed:
            _print_health(stack)
        sh(
            [*stack.base, "logs", "--no-color"],
            env=stack.env,
            log=stack_dir / "compose.log",
            check=False,
        )
        stack("down", "-v", "--remove-orphans", timeout=300)
        total = time.monotonic() - started
        sizes = {image: image_size_mb(image) for image in (BASE_IMAGE, *IMAGES)}
        phases = ", ".join(f"{k} {v:.0f}s" for k, v in timings.items())
        print(f"test-deploy: wall time {total:.0f}s ({phases})")
        print("test-deploy: image sizes: " + ", ".join(f"{k} {v:.0f} MB" for k, v in sizes.items()))
        if passed:
            shutil.rmtree(stack_dir)
        else:
            print(f"test-deploy: kept {stack_dir} (compose.log, test-deploy.log, outputs/)")
