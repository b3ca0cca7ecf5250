"""The rank context decides whether micro-batches without loss tokens run; skipping them
never changes the gradient, and the one-process context leaves the model unwrapped."""

from __future__ import annotations

from collections.abc import Callable

import torch

from tidal.batch.tensors import MicroBatchData
from tidal.trainer.config import ModelConfig, TrainerConfig
from tidal.trainer.ranks import SingleProcess
from tidal.trainer.train_step import Trainer

StepBatches = Callable[[int], list[MicroBatchData]]

TINY = ModelConfig(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64)


def without_loss(batch: MicroBatchData) -> MicroBatchData:
    return MicroBatchData(
        input_ids=batch.input_ids,
        position_ids=batch.position_ids,
        sample_lengths=batch.sample_lengths,
        loss_mask=torch.zeros_like(batch.loss_mask),
        advantages=torch.zeros_like(batch.advantages),
        behaviour_logprobs=batch.behaviour_logprobs,
    )


def forwards_and_grads(
    ranks: SingleProcess, batches: list[MicroBatchData]
) -> tuple[int, dict[str, torch.Tensor]]:
    config = TrainerConfig(model=TINY, device="cpu")
    trainer = Trainer(config, seed=0, device=torch.device("cpu"), ranks=ranks)
    calls = []
    trainer.model.register_forward_hook(lambda *_: calls.append(1))
    trainer.compute_gradients(batches, "pg")
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return len(calls), grads


def test_one_process_skips_micro_batches_without_loss_tokens(step_batches: StepBatches) -> None:
    batches = step_batches(1)
    forwards, _ = forwards_and_grads(SingleProcess(), [*batches, without_loss(batches[0])])
    assert forwards == len(batches)


def test_a_context_that_runs_empty_micro_batches_runs_them_for_the_same_gradient(
    step_batches: StepBatches,
) -> None:
    batches = [*step_batches(1), without_loss(step_batches(2)[0])]
    skipped_forwards, skipped = forwards_and_grads(SingleProcess(), batches)
    run_forwards, run = forwards_and_grads(SingleProcess(runs_empty_micro_batches=True), batches)
    assert run_forwards == skipped_forwards + 1
    assert skipped.keys() == run.keys()
    for name, grad in skipped.items():
        torch.testing.assert_close(run[name], grad, rtol=0, atol=1e-7)


def test_one_process_leaves_the_model_unwrapped() -> None:
    model = torch.nn.Linear(2, 2)
    assert SingleProcess().parallelize(model) is model
