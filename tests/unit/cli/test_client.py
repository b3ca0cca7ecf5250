"""`tidal client` against a stack that is down: every command names the service and its
address within a couple of seconds, instead of a bare DEADLINE_EXCEEDED after the call's
whole deadline."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tidal.cli import client
from tidal.cli.ports import free_address
from tidal.common.config.shared import SERVICES

DEFAULT_CONFIG = Path(__file__).resolve().parents[3] / "configs" / "default.toml"
WITHIN_S = 3.0


@pytest.fixture(autouse=True)
def operator_certificate(tls_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client dials as `operator` with the session's certificates (mTLS, the default)."""
    monkeypatch.setenv("TIDAL_SECURITY__TLS_DIR", str(tls_folder))


@pytest.fixture
def down() -> dict[str, str]:
    """An address for every service where nobody listens."""
    return {name: free_address() for name in SERVICES}


def _run(*args: str, endpoints: dict[str, str]) -> tuple[int, float]:
    overrides = [a for name, address in endpoints.items() for a in (f"--endpoints.{name}", address)]
    started = time.monotonic()
    with pytest.raises(SystemExit) as exited:
        client.main([*args, "@", str(DEFAULT_CONFIG), *overrides])
    return int(exited.value.code or 0), time.monotonic() - started


def test_generate_says_it_cannot_reach_inference(down, capsys) -> None:  # type: ignore[no-untyped-def]
    code, seconds = _run("generate", "abc>", endpoints=down)
    assert code == 1 and seconds < WITHIN_S
    assert f"cannot reach inference at {down['inference']}" in capsys.readouterr().err


def test_status_names_every_unreachable_service_quickly(down, capsys) -> None:  # type: ignore[no-untyped-def]
    code, seconds = _run("status", endpoints=down)
    assert code == 1 and seconds < WITHIN_S
    err = capsys.readouterr().err
    for name, address in down.items():
        assert f"cannot reach {name} at {address}" in err


@pytest.mark.parametrize(
    ("command", "service"), [("versions", "weightsync"), ("progress", "orchestrator")]
)
def test_versions_and_progress_name_their_service(command, service, down, capsys) -> None:  # type: ignore[no-untyped-def]
    code, seconds = _run(command, endpoints=down)
    assert code == 1 and seconds < WITHIN_S
    assert f"cannot reach {service} at {down[service]}" in capsys.readouterr().err


def test_status_has_a_row_per_inference_replica(down, capsys) -> None:  # type: ignore[no-untyped-def]
    replicas = [free_address(), free_address()]
    code, seconds = _run(
        "status", "--endpoints.inference-replicas", f'["{replicas[0]}", "{replicas[1]}"]',
        endpoints=down,
    )  # fmt: skip
    assert code == 1 and seconds < WITHIN_S
    out = capsys.readouterr()
    for i, address in enumerate(replicas):
        assert f"cannot reach inference at {address}" in out.err
        assert f"inference-{i}" in out.out
