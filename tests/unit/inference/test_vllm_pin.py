"""The vLLM extra pins the release whose torch pin is the inference package's own.

What this proves, offline and without a GPU: the extra names exactly one vLLM release, and
the torch that release requires, as recorded below from its published wheel, is the torch
the inference package pins. What it does not prove: the recorded fact is not re-read from
PyPI at test time (that needs the network, so it stays out of `make test`); re-check it
when either pin moves with

    pip download vllm==<version> --no-deps -d /tmp/vllm && \
      unzip -p /tmp/vllm/vllm-*.whl 'vllm-*.dist-info/METADATA' | grep '^Requires-Dist: torch'

or resolve the whole extra with `pip install --dry-run -e 'services/inference[vllm]'`.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

INFERENCE_PYPROJECT = Path(__file__).parents[3] / "services" / "inference" / "pyproject.toml"

VLLM_TORCH_PINS = {"0.32.0": "2.13.0"}
"""vLLM release → its wheel's `Requires-Dist: torch==…`, read with the command above on
2026-11-24 (vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl, sha256 5e2ecdc5…8611)."""


def pinned(requirements: list[str], name: str) -> str:
    """The exact version `name==X` pins among `requirements` (fails if not one exact pin)."""
    pins = [m for r in requirements if (m := re.fullmatch(rf"{name}==([\w.]+)", r.strip()))]
    assert len(pins) == 1, f"expected one exact pin of {name} in {requirements}"
    return pins[0].group(1)


def test_the_vllm_extra_pins_the_release_built_for_our_torch() -> None:
    project = tomllib.loads(INFERENCE_PYPROJECT.read_text())["project"]
    torch = pinned(project["dependencies"], "torch")
    vllm = pinned(project["optional-dependencies"]["vllm"], "vllm")
    assert vllm in VLLM_TORCH_PINS, f"no recorded torch pin for vllm {vllm}: check it (docstring)"
    assert VLLM_TORCH_PINS[vllm] == torch, (
        f"vllm {vllm} requires torch=={VLLM_TORCH_PINS[vllm]}, the inference package pins "
        f"torch=={torch}"
    )
