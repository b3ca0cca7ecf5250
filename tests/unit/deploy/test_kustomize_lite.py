"""kustomize_lite renders like kustomize for what deploy/k8s uses, and refuses the rest."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from .kustomize_lite import KustomizeError, render, strategic_merge

POD: dict[str, Any] = {
    "containers": [
        {
            "name": "a",
            "image": "img-a:1",
            "args": ["x", "y"],
            "env": [{"name": "K", "value": "1"}, {"name": "L", "value": "2"}],
            "volumeMounts": [{"name": "v", "mountPath": "/v"}],
        },
        {"name": "b", "image": "registry.local:5000/img-b"},
    ],
    "tolerations": [{"key": "t", "operator": "Exists"}],
}


def test_strategic_merge_merges_keyed_lists_and_replaces_the_others() -> None:
    patch = {
        "containers": [
            {"name": "a", "args": ["z"], "env": [{"name": "L", "value": "3"}, {"name": "M"}]},
            {"name": "c", "image": "img-c"},
        ],
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
    }
    merged = strategic_merge(POD, patch)
    # kustomize's order: the patch's items, then the base's others.
    a, c, b = merged["containers"]
    assert a["args"] == ["z"]  # no merge key: replaced
    assert a["env"] == [{"name": "L", "value": "3"}, {"name": "M"}, {"name": "K", "value": "1"}]
    assert a["volumeMounts"] == POD["containers"][0]["volumeMounts"]
    assert b == POD["containers"][1] and c == {"name": "c", "image": "img-c"}
    assert merged["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert POD["containers"][0]["args"] == ["x", "y"]  # the base is not changed
    assert "tolerations" not in strategic_merge(POD, {"tolerations": None})


@pytest.mark.parametrize(
    "patch",
    [{"$patch": "replace"}, {"containers": [{"image": "no-name"}]}],
)
def test_strategic_merge_refuses_what_it_does_not_implement(patch: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(KustomizeError):
        strategic_merge(POD, patch)


def _write(folder: Path, name: str, data: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(yaml.safe_dump_all(data if isinstance(data, list) else [data]))


def _tree(tmp_path: Path, overlay: dict) -> Path:  # type: ignore[type-arg]
    base = tmp_path / "base"
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {"template": {"spec": POD}},
    }
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}
    _write(base, "objects.yaml", [namespace, deployment])
    (base / "f.txt").write_text("file body\n")
    _write(
        base,
        "kustomization.yaml",
        {
            "namespace": "ns",
            "resources": ["objects.yaml"],
            "generatorOptions": {"disableNameSuffixHash": True, "labels": {"l": "v"}},
            "configMapGenerator": [
                {"name": "cm", "files": ["f.txt", "other=f.txt"], "literals": ['Q="quoted"']}
            ],
            "secretGenerator": [{"name": "s", "files": ["f.txt"]}],
        },
    )
    _write(tmp_path / "overlay", "kustomization.yaml", {"resources": ["../base"], **overlay})
    return tmp_path / "overlay"


def test_render_generates_namespaces_patches_and_sets_images(tmp_path: Path) -> None:
    patch = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}
    patch["spec"] = {"template": {"spec": {"containers": [{"name": "a", "env": [{"name": "N"}]}]}}}
    _write(tmp_path / "overlay", "p.yaml", patch)
    images = [
        {"name": "img-a", "newTag": "2"},
        {"name": "registry.local:5000/img-b", "newTag": "gpu"},
    ]
    overlay = _tree(tmp_path, {"patches": [{"path": "p.yaml"}], "images": images})
    namespace, deployment, config_map, secret = render(overlay)
    assert namespace["metadata"] == {"name": "ns"}  # cluster-scoped: no namespace
    assert deployment["metadata"]["namespace"] == "ns"
    a, b = deployment["spec"]["template"]["spec"]["containers"]
    assert [v["name"] for v in a["env"]] == ["N", "K", "L"]
    assert a["image"] == "img-a:2" and b["image"] == "registry.local:5000/img-b:gpu"
    assert config_map["metadata"] == {"name": "cm", "labels": {"l": "v"}, "namespace": "ns"}
    assert config_map["data"] == {"f.txt": "file body\n", "other": "file body\n", "Q": "quoted"}
    assert secret["type"] == "Opaque"
    assert base64.b64decode(secret["data"]["f.txt"]) == b"file body\n"


@pytest.mark.parametrize(
    "overlay",
    [
        {"commonLabels": {"a": "b"}},  # a key it does not implement
        {"patches": [{"path": "missing-target.yaml"}]},
        {"images": [{"name": "not-used"}]},
        {"patches": [{"patch": "inline", "target": {"kind": "Deployment"}}]},
    ],
)
def test_render_refuses_what_it_cannot_render_faithfully(tmp_path: Path, overlay: dict) -> None:  # type: ignore[type-arg]
    patch = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "other"}}
    _write(tmp_path / "overlay", "missing-target.yaml", patch)
    with pytest.raises(KustomizeError):
        render(_tree(tmp_path, overlay))


def test_generators_need_names_without_a_hash_suffix(tmp_path: Path) -> None:
    overlay = _tree(tmp_path, {})
    base = overlay.parent / "base" / "kustomization.yaml"
    spec = yaml.safe_load(base.read_text())
    del spec["generatorOptions"]["disableNameSuffixHash"]
    base.write_text(yaml.safe_dump(spec))
    with pytest.raises(KustomizeError, match="disableNameSuffixHash"):
        render(overlay)
