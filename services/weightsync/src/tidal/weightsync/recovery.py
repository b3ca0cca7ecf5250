"""Rebuilding the registry from disk after a restart: adopt only versions that verify.

A `v<N>` folder is adopted only when its manifest parses, names its own version, lists every
required file, and every file matches its size and sha256; any other version folder is
deleted inside the weights root, with the reason logged. It runs before the service
serves, newest first, so no client ever sees an unverified version.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path

from tidal.common.files.safe_remove import remove_inside
from tidal.weights.folder import sweep_partial
from tidal.weights.manifest import MANIFEST_FILE, CorruptWeights, WeightManifest, verify_files

log = logging.getLogger(__name__)

VERSION_FOLDER = re.compile(r"^v(\d+)$")


class UnverifiableVersion(Exception):
    """A version folder that must not be served; the message says why."""


def verified_manifest(folder: Path, required: tuple[str, ...]) -> WeightManifest:
    """The manifest of `folder` after checking every file against it; raises
    UnverifiableVersion naming what is wrong."""
    number = int(VERSION_FOLDER.match(folder.name).group(1))  # type: ignore[union-attr]
    if not (folder / MANIFEST_FILE).is_file():
        raise UnverifiableVersion(f"{folder} has no {MANIFEST_FILE} (a half-written version)")
    try:
        manifest = WeightManifest.read(folder)
    except (
        OSError,
        ValueError,
        KeyError,
        TypeError,
    ) as exc:  # json.JSONDecodeError is a ValueError
        raise UnverifiableVersion(f"{folder}/{MANIFEST_FILE} is unreadable: {exc}") from exc
    if manifest.version != number:
        raise UnverifiableVersion(
            f"{folder}/{MANIFEST_FILE} describes version {manifest.version}, not {number}"
        )
    if Path(manifest.location).resolve() != folder.resolve():
        log.warning("%s names location %s; using its own folder", folder, manifest.location)
        manifest = replace(manifest, location=str(folder))
    listed = {f.path for f in manifest.files}
    missing = [name for name in required if name not in listed]
    if missing:
        raise UnverifiableVersion(f"{folder}/{MANIFEST_FILE} does not list {', '.join(missing)}")
    try:
        verify_files(manifest)
    except (CorruptWeights, OSError) as exc:
        raise UnverifiableVersion(str(exc)) from exc
    return manifest


def recover_versions(root: Path, required: tuple[str, ...]) -> list[WeightManifest]:
    """Manifests of every version under `root` that verifies, oldest first; every
    version folder that does not is removed (see the module docstring)."""
    sweep_partial(root)
    if not root.is_dir():
        return []
    folders = [p for p in root.iterdir() if p.is_dir() and VERSION_FOLDER.match(p.name)]
    adopted = []
    for folder in sorted(folders, key=lambda p: int(p.name[1:]), reverse=True):
        try:
            adopted.append(verified_manifest(folder, required))
        except UnverifiableVersion as exc:
            log.error("not serving %s, removing it: %s", folder.name, exc)
            remove_inside(folder, root, ignore_errors=True)
    if adopted:
        log.info("recovered verified versions %s from %s", sorted(m.version for m in adopted), root)
    return sorted(adopted, key=lambda m: m.version)
