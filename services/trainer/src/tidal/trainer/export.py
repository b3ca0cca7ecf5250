"""`tidal export @ run.toml [--export.out DIR] [--export.checkpoint DIR | --export.version N]`:
a run's weights as a complete Hugging Face model folder.

Decisions:
- Two sources, one result. A checkpoint (`trainer.ckpt.dir`'s `step_XXXXXXXX`) is
  restored into a trainer built from the run's config, so LoRA adapters are merged as
  for publishing; a published version (`v<N>/` under the run's weights folder) is read and
  verified against its manifest. Without either flag the newest complete checkpoint is
  used, else the newest published version: the latest weights the run has.
- The folder is complete: weights (HF checkpoint names, tied head omitted), config.json
  with the tokenizer's token ids, generation_config.json and the tokenizer files with the
  chat template (`companion_files.py`), so `transformers`' `AutoModelForCausalLM` /
  `AutoTokenizer` and vLLM load it as they load a downloaded model.
- Written atomically (temp folder renamed into place, `tidal.models.hf_folder`); an
  existing model folder at `--export.out` (config.json and files) is replaced; any other
  existing non-empty folder is refused (exit 2 naming `export.out`) and left untouched.
- Versions holding only LoRA adapters cannot stand alone: exporting one is an error that
  names the checkpoint route instead.
- The command's options are a config section (`[export]`), so they get `--help`, typed
  validation and defaults from one class, like every other key. Other services' sections
  (and `tidal sft`'s `[sft]`) of the run file pass through unchecked. torch is imported
  only after the config parsed.
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

    export: ExportOptions = ExportOptions()
    """Which weights to export, and where to."""
    sft: dict[str, Any] = Field(default_factory=dict)
    """`tidal sft`'s section, carried through unchecked."""

    @property
    def out_dir(self) -> Path:
        return self.export.out or self.run.dir / "export"


def export_run(config: ExportRunConfig) -> Path:
    """Write the folder; returns it. Raises ConfigError when there is nothing to export."""
    from tidal.models.hf_config import ModelFolderError
    from tidal.models.hf_folder import check_replaceable, write_folder  # torch: after parsing
    from tidal.trainer.companion_files import run_companion_files

    try:
        check_replaceable(config.out_dir)
    except ModelFolderError as exc:
        raise ConfigError(f"export.out: {exc}") from None
    companions = run_companion_files(config.run.tokenizer, config.model_folder())
    source, (hf_config, state) = _weights(config)
    out = config.out_dir
    write_folder(out, companions.config(hf_config), state, extra_files=companions.files)
    log.info("exported %s to %s", source, out)
    return out


def _weights(config: ExportRunConfig) -> tuple[str, tuple[dict[str, Any], dict[str, Any]]]:
    """(what was exported, (config.json, HF-named state dict))."""
    from tidal.trainer.checkpoint import CheckpointManager

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

    from tidal.trainer.checkpoint import CheckpointManager
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
