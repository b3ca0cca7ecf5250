"""`tidal export @ run.toml [--export.out DIR] [--export.checkpoint DIR | --export.version N]`:
a run's weights as a complete Hugging Face model folder.

Two sources, one result: a checkpoint is restored into a trainer built from the run's
config (so LoRA adapters are merged as for publishing), a published version is read and
verified against its manifest; by default the newest checkpoint, else the newest version.
The folder carries weights, config.json with token ids, generation_config.json and the
tokenizer files, written atomically; an existing folder that is not a model folder is
refused. The options are the `[export]` config section; torch is imported after parsing.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from tidal.common.config.loading import BaseConfig, load_or_exit
from tidal.common.errors import ConfigError
from tidal.common.observability.logging import setup_logging
from tidal.trainer.config import TrainerRunConfig

log = logging.getLogger(__name__)
USAGE = "tidal export @ run.toml [--export.out DIR] [--export.checkpoint DIR | --export.version N]"


class ExportOptions(BaseConfig):
    out: Path | None = None
    """Folder to write; default `<run dir>/export`. An existing model folder there is
    replaced; any other non-empty folder is refused."""
    checkpoint: Path | None = None
    """Checkpoint folder to export (`<run dir>/checkpoints/step_00000060`)."""
    version: int | None = Field(default=None, ge=0)
    """Published version to export (`v<N>/` in the run's weights folder)."""

    @model_validator(mode="after")
    def _one_source(self) -> ExportOptions:
        if self.checkpoint is not None and self.version is not None:
            raise ValueError("set export.checkpoint or export.version, not both")
        return self


class ExportRunConfig(TrainerRunConfig):
    """A run's config (as `tidal rl` or `tidal sft` read it) plus what to export."""

    export: ExportOptions = ExportOptions()  # type: ignore[assignment]
    """Which weights to export, and where to."""

    @property
    def out_dir(self) -> Path:
        return self.export.out or self.run.dir / "export"


def export_run(config: ExportRunConfig) -> Path:
    """Write the folder; returns it. Raises ConfigError when there is nothing to export."""
    from tidal.models.hf_config import ModelFolderError
    from tidal.models.hf_folder import check_replaceable, write_folder  # torch: after parsing
    from tidal.trainer.persistence.hf_folder_files import run_hf_folder_files

    try:
        check_replaceable(config.out_dir)
    except ModelFolderError as exc:
        raise ConfigError(f"export.out: {exc}") from None
    folder_files = run_hf_folder_files(config.run.tokenizer, config.model_folder())
    source, (hf_config, state) = _weights(config)
    out = config.out_dir
    write_folder(out, folder_files.config(hf_config), state, extra_files=folder_files.files)
    log.info("exported %s to %s", source, out)
    return out


def _weights(config: ExportRunConfig) -> tuple[str, tuple[dict[str, Any], dict[str, Any]]]:
    """(what was exported, (config.json, HF-named state dict))."""
    from tidal.trainer.persistence.checkpoint import CheckpointManager

    options = config.export
    if options.checkpoint is not None:
        return str(options.checkpoint), _from_checkpoint(config, options.checkpoint)
    if options.version is not None:
        return f"version {options.version}", _from_version(config, options.version)
    latest = CheckpointManager(config.checkpoint_dir, keep_last=1).latest()
    if latest is not None:
        return str(latest), _from_checkpoint(config, latest)
    newest = _newest_version(config.publish_dir)
    if newest is None:
        raise ConfigError(
            f"nothing to export: no complete checkpoint in {config.checkpoint_dir} and no "
            f"published version in {config.publish_dir}; name one with --export.checkpoint "
            "or --export.version"
        )
    return f"version {newest}", _from_version(config, newest)


def _from_checkpoint(config: ExportRunConfig, path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    from tidal.trainer.persistence.checkpoint import CheckpointManager
    from tidal.trainer.train_step import Trainer

    torch.set_num_threads(config.trainer.num_threads)
    trainer = Trainer(config.trainer, seed=config.run.seed, device=torch.device("cpu"))
    CheckpointManager(path.parent, keep_last=1).load(trainer, path)
    return trainer.hf_config(), trainer.state_dict_for_export()


def _from_version(config: ExportRunConfig, version: int) -> tuple[dict[str, Any], dict[str, Any]]:
    from tidal.weights.folder import load_version, version_dir
    from tidal.weights.manifest import LORA_ADAPTERS, WeightManifest

    folder = version_dir(config.publish_dir, version)
    if not folder.is_dir():
        raise ConfigError(f"version {version} is not published in {config.publish_dir}")
    manifest = WeightManifest.read(folder)
    if manifest.format == LORA_ADAPTERS:
        raise ConfigError(
            f"version {version} holds only LoRA adapters (on version {manifest.base_version}); "
            "export a checkpoint instead (--export.checkpoint), which merges them"
        )
    hf_config, state = load_version(manifest)
    return hf_config, state


def _newest_version(root: Path) -> int | None:
    from tidal.weights.manifest import MANIFEST_FILE

    versions = [
        int(p.name[1:])
        for p in (root.iterdir() if root.is_dir() else ())
        if p.name.startswith("v") and p.name[1:].isdigit() and (p / MANIFEST_FILE).is_file()
    ]
    return max(versions, default=None)


def main(argv: Sequence[str] | None = None) -> None:
    config = load_or_exit(ExportRunConfig, sys.argv[1:] if argv is None else argv, usage=USAGE)
    setup_logging("export", level=config.telemetry.log_level)
    try:
        out = export_run(config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"tidal: exported to {out}")
