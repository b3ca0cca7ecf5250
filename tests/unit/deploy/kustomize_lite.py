"""Renders deploy/k8s's kustomizations for the manifest tests, without the kustomize binary.

Why our own: no kustomize renderer installs from the registries these machines reach (the
`kustomize` binary is a Go program downloaded from GitHub releases; PyPI's `kustomize` is
an unrelated generator library and `pykustomize` needs Python 3.14), and the suite must
validate the manifests offline. So this renders the subset of kustomization.yaml that
deploy/k8s uses, the way kustomize does, and refuses everything else by name, so a
kustomization that grows a feature this does not implement fails the test instead of
rendering differently from `kubectl apply -k`. Where a `kubectl` with its built-in
kustomize is on PATH, the manifest test also renders with it and requires the same objects.
Supported:

- `resources` (YAML files, possibly multi-document, and folders holding a
  kustomization.yaml), rendered depth first, in order;
- `configMapGenerator` / `secretGenerator` with `files` (`path` or `key=path`) and
  `literals` (`KEY=VALUE`), only under `generatorOptions.disableNameSuffixHash: true`
  (names with a content hash would need every reference rewritten);
  `generatorOptions.labels`;
- `namespace` (set on every namespaced object);
- `patches` with `path` to a strategic-merge patch of a Deployment or StatefulSet, found by
  kind and name (lists merge by the merge keys Kubernetes declares for the pod spec:
  containers and env and volumes by name, volumeMounts by mountPath, ports by
  containerPort; every other list is replaced, as Kubernetes does for lists without a
  merge key); `$patch` directives are refused;
- `images` (`name` with `newName`, `newTag` or `digest`) on pod-template containers.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION = "kustomization.yaml"
SUPPORTED = {
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "generatorOptions",
    "configMapGenerator",
    "secretGenerator",
    "patches",
    "images",
}
CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "StorageClass", "ClusterRole"}
PATCHABLE = {"Deployment", "StatefulSet"}
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}
"""patchMergeKey of the pod spec's lists (k8s.io/api core/v1 types)."""

Obj = dict[str, Any]


class KustomizeError(ValueError):
    """A kustomization this renderer cannot render faithfully, or a broken one."""


def render(folder: Path) -> list[Obj]:
    """Every object `kubectl kustomize folder` would print, in resource order."""
    spec = yaml.safe_load((folder / KUSTOMIZATION).read_text()) or {}
    unknown = set(spec) - SUPPORTED
    if unknown:
        raise KustomizeError(f"{folder / KUSTOMIZATION}: unsupported keys {sorted(unknown)}")
    objects: list[Obj] = []
    for entry in spec.get("resources", []):
        path = (folder / entry).resolve()
        if path.is_dir():
            objects += render(path)
        else:
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    objects += _generated(folder, spec)
    if "namespace" in spec:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj.setdefault("metadata", {})["namespace"] = spec["namespace"]
    for patch_entry in spec.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise KustomizeError(f"patch {patch_entry}: only `path` patches are supported")
        for patch in yaml.safe_load_all((folder / patch_entry["path"]).read_text()):
            _apply_patch(objects, patch)
    for image in spec.get("images", []):
        _set_image(objects, image)
    return objects


def _generated(folder: Path, spec: Obj) -> list[Obj]:
    options = spec.get("generatorOptions", {})
    generators = [("ConfigMap", g) for g in spec.get("configMapGenerator", [])]
    generators += [("Secret", g) for g in spec.get("secretGenerator", [])]
    if not generators:
        return []
    if set(options) - {"disableNameSuffixHash", "labels"}:
        raise KustomizeError(f"generatorOptions {sorted(options)}: unsupported option")
    if options.get("disableNameSuffixHash") is not True:
        raise KustomizeError("generators need generatorOptions.disableNameSuffixHash: true")
    out = []
    for kind, generator in generators:
        if set(generator) - {"name", "files", "literals", "type"}:
            raise KustomizeError(f"{kind} generator {generator['name']}: unsupported keys")
        data: dict[str, str] = {}
        for entry in generator.get("files", []):
            key, _, path = entry.rpartition("=") if "=" in entry else ("", "", entry)
            data[key or Path(path).name] = (folder / path).read_text()
        for literal in generator.get("literals", []):
            key, sep, value = literal.partition("=")
            if not sep:
                raise KustomizeError(f"literal {literal!r} is not KEY=VALUE")
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            data[key] = value
        metadata: Obj = {"name": generator["name"]}
        if options.get("labels"):
            metadata["labels"] = dict(options["labels"])
        obj: Obj = {"apiVersion": "v1", "kind": kind, "metadata": metadata}
        if kind == "Secret":
            obj["type"] = generator.get("type", "Opaque")
            obj["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        else:
            obj["data"] = data
        out.append(obj)
    return out


def _apply_patch(objects: list[Obj], patch: Obj) -> None:
    kind, name = patch.get("kind"), patch.get("metadata", {}).get("name")
    if kind not in PATCHABLE:
        raise KustomizeError(f"patch of {kind} {name}: only {sorted(PATCHABLE)} are supported")
    targets = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    if len(targets) != 1:
        raise KustomizeError(f"patch of {kind} {name}: {len(targets)} matching objects")
    body = {k: v for k, v in patch.items() if k not in ("apiVersion", "kind", "metadata")}
    merged = strategic_merge(targets[0], body)
    targets[0].clear()
    targets[0].update(merged)


def strategic_merge(base: Any, patch: Any, field: str = "") -> Any:
    """`patch` merged into a copy of `base` (maps by key, keyed lists by merge key)."""
    if isinstance(patch, dict):
        if any(str(k).startswith("$") for k in patch):
            raise KustomizeError(f"{field}: $-directives are not supported")
        out = copy.deepcopy(base) if isinstance(base, dict) else {}
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = strategic_merge(out.get(key), value, key)
        return out
    if isinstance(patch, list) and field in MERGE_KEYS and isinstance(base, list):
        # kustomize's order: the patch's items first (merged with the base item of the
        # same key), then the base items the patch does not name.
        key = MERGE_KEYS[field]
        by_key = {b.get(key): b for b in base}
        out_list = []
        for item in patch:
            if not isinstance(item, dict) or key not in item:
                raise KustomizeError(f"{field}: patch item without its merge key {key!r}")
            out_list.append(strategic_merge(by_key.get(item[key], {}), item, field))
        named = {item[key] for item in patch}
        return out_list + [copy.deepcopy(b) for b in base if b.get(key) not in named]
    return copy.deepcopy(patch)


def _set_image(objects: list[Obj], image: Obj) -> None:
    if set(image) - {"name", "newName", "newTag", "digest"}:
        raise KustomizeError(f"images entry {image}: unsupported keys")
    found = False
    for obj in objects:
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            ref = container["image"]
            name = ref.split("@", 1)[0]
            tag = ""
            if ":" in name.rsplit("/", 1)[-1]:
                name, tag = name.rsplit(":", 1)
            if name != image["name"]:
                continue
            found = True
            name = image.get("newName", name)
            if "digest" in image:
                container["image"] = f"{name}@{image['digest']}"
            else:
                tag = image.get("newTag", tag)
                container["image"] = f"{name}:{tag}" if tag else name
    if not found:
        raise KustomizeError(f"images entry {image['name']}: no container uses that image")
