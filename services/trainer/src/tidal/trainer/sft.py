"""`tidal sft @ cfg.toml`: supervised fine-tuning on prompt/completion or chat data, resumable.

The same `Trainer` and packed micro-batches as RL steps (the orchestrator's packer, the
servicer's tensor conversion), with the SFT loss. Checkpoints every `trainer.ckpt.interval`
steps and at the last hold the data position, so `--resume` finishes with exactly the
weights of an uninterrupted run; existing checkpoints without `--resume` are an error.
The final weights become a complete Hugging Face folder under `<run dir>/final`; metrics
go to `<run dir>/sft_metrics.jsonl`. The tokenizer is `run.tokenizer`, as in RL runs.
torch is imported only once the config parsed, so `--help` and `--dry-run` are instant.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tidal.batch.balance import pack_for_ranks
from tidal.batch.packing import TrainSample
from tidal.common.config.loading import load_or_exit
from tidal.common.config.shared import trainer_model_folder
from tidal.common.errors import ConfigError
from tidal.common.files.modes import apply_file_policy
from tidal.common.files.step_jsonl import drop_lines_after
from tidal.common.observability.logging import setup_logging
from tidal.text.conversation import ChatRendering, uses_template
from tidal.text.loader import load_tokenizer
from tidal.trainer.config import SftRunConfig
from tidal.trainer.sft_data import SampleOrder, read_records, to_samples

if TYPE_CHECKING:
    from tidal.batch.tensors import MicroBatchData
    from tidal.trainer.train_step import Trainer

log = logging.getLogger(__name__)
USAGE = "tidal sft @ cfg.toml [--sft.data.path FILE] [--resume]"


def pack_for_trainer(samples: Sequence[TrainSample], budget: int) -> list[MicroBatchData]:
    """Pack samples as an RL step is packed and convert them to the trainer's tensors."""
    from tidal.batch.tensors import micro_batch_from_packed  # torch: after the config parsed

    longest = max(s.num_tokens for s in samples)
    if longest > budget:
        raise ConfigError(
            f"sft.micro_batch_tokens {budget} is smaller than a sample of {longest} tokens"
        )
    (packed,) = pack_for_ranks(samples, budget, 1)  # one process: one data-parallel rank
    return [micro_batch_from_packed(p) for p in packed]


def run_sft(config: SftRunConfig, *, max_steps: int | None = None) -> list[dict[str, float]]:
    """Train (or resume) the SFT run; stops after step `max_steps` if given. Returns metrics."""
    # torch and the modules that import it: only once the config parsed (instant --help).
    import torch

    from tidal.models.device import resolve_device
    from tidal.trainer.persistence.checkpoint import CheckpointManager
    from tidal.trainer.train_step import Trainer

    sft, ckpt = config.sft, config.trainer.ckpt
    if sft.data.path is None:
        raise ConfigError("sft.data.path is required (a .jsonl or .parquet file)")
    records = read_records(
        sft.data.path,
        prompt_key=sft.data.prompt_key,
        completion_key=sft.data.completion_key,
        fmt=sft.data.format,
    )
    samples = to_samples(
        records, sft_rendering(config), max_seq_len=config.trainer.model.max_seq_len
    )
    order = SampleOrder(samples, seed=config.run.seed)

    torch.set_num_threads(config.trainer.num_threads)
    device = resolve_device(config.trainer.device, service="trainer")
    trainer = Trainer(config.trainer, seed=config.run.seed, device=device)
    manager = CheckpointManager(config.checkpoint_dir, keep_last=ckpt.keep_last)
    position = 0
    if config.resume and manager.latest() is not None:
        position = manager.load(trainer)["data_position"]
    elif manager.latest() is not None:
        raise ConfigError(
            f"{config.checkpoint_dir} already holds checkpoints; pass --resume to continue "
            "from the newest, or use a new --run.name"
        )
    elif config.resume:
        log.warning("--resume: no checkpoint under %s; starting from step 1", manager.root)
    log.info("SFT of %s on %d records, %d steps", trainer.describe(), len(samples), sft.steps)

    config.run.dir.mkdir(parents=True, exist_ok=True)
    history = []
    last = sft.steps if max_steps is None else min(sft.steps, max_steps)
    interval = ckpt.every(journaled=False)
    metrics_path = config.run.dir / "sft_metrics.jsonl"
    drop_lines_after(metrics_path, trainer.trained_step)  # steps redone after a resume
    with open(metrics_path, "a", encoding="utf-8") as metrics_file:
        for step in range(trainer.trained_step + 1, last + 1):
            batch, position = order.batch(position, sft.batch_size)
            micro_batches = pack_for_trainer(batch, sft.micro_batch_tokens)
            metrics = trainer.train_step(step, micro_batches, "sft")
            metrics_file.write(json.dumps({"step": step, **metrics}) + "\n")
            metrics_file.flush()
            history.append(metrics)
            log.info("step %d loss %.4f lr %.3g", step, metrics["loss"], metrics["lr"])
            if (interval and step % interval == 0) or step == sft.steps:
                manager.save(trainer, extra={"data_position": position})
    if trainer.trained_step == sft.steps:
        export_final(trainer, config)
    return history


def sft_rendering(config: SftRunConfig) -> ChatRendering:
    """The run's tokenizer (`run.tokenizer`, the trainer's model folder for "auto") and
    whether prompt/completion records use its chat template ("auto": a folder's)."""
    tokenizer = load_tokenizer(
        config.run.tokenizer, model_path=trainer_model_folder(config.trainer)
    )
    return ChatRendering(tokenizer, uses_template(tokenizer, "auto", key="sft chat template"))


def export_final(trainer: Trainer, config: SftRunConfig) -> None:
    """Write the final weights as a complete Hugging Face folder under `<run dir>/final`:
    config.json with token ids, model.safetensors, generation_config.json and the run's
    tokenizer files (`hf_folder_files.py`), written atomically like every export."""
    from tidal.models.hf_folder import write_folder  # imports torch: after the config parsed
    from tidal.trainer.persistence.hf_folder_files import run_hf_folder_files

    folder = config.run.dir / "final"
    files = run_hf_folder_files(config.run.tokenizer, trainer_model_folder(config.trainer))
    write_folder(
        folder,
        files.config(trainer.hf_config()),
        trainer.state_dict_for_export(),
        extra_files=files.files,
    )
    log.info("final weights written to %s", folder)


def main(argv: Sequence[str] | None = None) -> None:
    config = load_or_exit(SftRunConfig, sys.argv[1:] if argv is None else argv, usage=USAGE)
    apply_file_policy(shared_readable=config.run.shared_readable)
    setup_logging("sft", level=config.telemetry.log_level)
    try:
        run_sft(config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
