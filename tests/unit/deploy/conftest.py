"""Fixtures of the deploy/k8s tests: each overlay rendered with real certificates.

`tree` copies deploy/k8s and runs the real `make-certs.sh` in the copy, as a user does
before `kubectl apply -k`, so the Secrets hold real certificates; `rendered` renders each
overlay with `kustomize_lite` (which says why not the kustomize binary).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .k8s_render import K8S, OVERLAYS, Obj
from .kustomize_lite import render


@pytest.fixture(scope="session")
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


@pytest.fixture(scope="session")
def rendered(tree: Path) -> dict[str, list[Obj]]:
    return {name: render(tree / "overlays" / name) for name in OVERLAYS}
