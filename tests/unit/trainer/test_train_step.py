"""The Trainer's step: packing-invariant gradients, learning, step order, metrics."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from tidal.batch.balance import pack_for_ranks
from tidal.batch.packing import TrainSample
from tidal.batch.tensors import MicroBatchData, micro_batch_from_packed, positions_for
from tidal.common.errors import FailedPrecondition
from tidal.trainer.config import LossConfig, ModelConfig, OptimConfig, TrainerConfig
from tidal.trainer.train_step import Trainer

TINY = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)


@dataclass
class Sample:
    ids: list[int]
    prompt_len: int  # tokens from here on are trained
    advantage: float
    behaviour: list[float]  # per token; entries before prompt_len are ignored
    token_advantages: list[float] | None = None
    """Each token's own term added to `advantage` (None: the sample's value on every token)."""

    def advantages(self) -> torch.Tensor:
        terms = torch.tensor(self.token_advantages or [0.0] * len(self.ids))
        return self.advantage + terms  # (len(ids),)


def pack(samples: list[Sample], version: int | None = None) -> MicroBatchData:
    """Concatenate samples padding-free, as the orchestrator does; `version` sampled every
    loss token (None: unknown)."""
    lengths = torch.tensor([len(s.ids) for s in samples])
    mask = torch.cat([(torch.arange(len(s.ids)) >= s.prompt_len).float() for s in samples])
    return MicroBatchData(
        input_ids=torch.tensor([t for s in samples for t in s.ids]),
        position_ids=positions_for(lengths),
        sample_lengths=lengths,
        loss_mask=mask,
        advantages=torch.cat([s.advantages() for s in samples]) * mask,
        behaviour_logprobs=torch.tensor([b for s in samples for b in s.behaviour]) * mask,
        policy_versions=None if version is None else torch.where(mask > 0, version, -1),
    )


def random_samples(n: int, seed: int) -> list[Sample]:
    g = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(n):
        length = int(torch.randint(4, 14, (), generator=g))
        ids = torch.randint(0, 259, (length,), generator=g).tolist()
        behaviour = (-torch.rand(length, generator=g) * 6 - 3).tolist()
        advantage = float(torch.randn((), generator=g))
        terms = (torch.randn(length, generator=g) * 0.5).tolist()  # advantages vary per token
        samples.append(Sample(ids, 2, advantage, behaviour, terms))
    return samples


def make_trainer(loss: dict[str, object] | None = None, **optim: object) -> Trainer:
    config = TrainerConfig(
        model=TINY,
        optim=OptimConfig.model_validate(optim),
        loss=LossConfig.model_validate(loss or {}),
        device="cpu",
    )
    return Trainer(config, seed=0, device=torch.device("cpu"))


def grads(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


LOSS_VARIANTS = {
    "sft": ("sft", {}),
    "token-mean": ("pg", {}),
    "gspo-sequence-mean": ("pg", {"ratio_level": "sequence", "norm": "sequence"}),
    "dr-grpo-kl-entropy": (
        "pg",
        {
            "norm": "constant",
            "norm_constant": 64.0,
            "kl": {"coef": 0.1, "estimator": "k3"},
            "entropy_coef": 0.01,
            "trust_region": {"ratio_low": 0.5, "ratio_high": 2.0},
        },
    ),
    "decoupled-tis-token-mis-kl": (
        "pg",
        {
            "objective": "decoupled",
            "tis_cap": 2.0,
            "trust_region": {"ratio_low": 0.05, "ratio_high": 20.0},
            "kl": {"coef": 0.1},
        },
    ),
    "gspo-tis-sequence-mis-geo": (
        "pg",
        {
            "ratio_level": "sequence",
            "norm": "sequence",
            "tis_cap": 1.5,
            "trust_region": {
                "sequence_ratio_low": 0.05,
                "sequence_ratio_high": 20.0,
                "geo_ratio_low": 0.2,
                "geo_ratio_high": 5.0,
            },
        },
    ),
}


@pytest.mark.parametrize("variant", list(LOSS_VARIANTS))
def test_packed_and_unpacked_micro_batches_give_the_same_loss_and_gradients(variant: str) -> None:
    kind, loss = LOSS_VARIANTS[variant]
    samples = random_samples(6, seed=0)
    packed, unpacked = make_trainer(loss), make_trainer(loss)
    packed_metrics = packed.compute_gradients([pack(samples)], kind)  # type: ignore[arg-type]
    split = [pack(samples[:1]), pack(samples[1:4]), *(pack([s]) for s in samples[4:])]
    unpacked_metrics = unpacked.compute_gradients(split, kind)  # type: ignore[arg-type]

    torch.testing.assert_close(packed_metrics["loss"], unpacked_metrics["loss"])
    torch.testing.assert_close(packed_metrics["entropy"], unpacked_metrics["entropy"])
    g_packed, g_unpacked = grads(packed), grads(unpacked)
    assert g_packed.keys() == g_unpacked.keys() and len(g_packed) > 0
    for name in g_packed:
        torch.testing.assert_close(g_packed[name], g_unpacked[name], rtol=1e-4, atol=1e-6)


def test_a_sample_does_not_see_its_neighbours_in_the_pack() -> None:
    a, b = random_samples(2, seed=1)
    alone, together = make_trainer(), make_trainer()
    # Only sample b carries loss: its gradient must not depend on sample a before it.
    a_no_loss = Sample(a.ids, len(a.ids), 0.0, a.behaviour)
    alone_loss = alone.compute_gradients([pack([b])], "sft")["loss"]
    packed_loss = together.compute_gradients([pack([a_no_loss, b])], "sft")["loss"]
    torch.testing.assert_close(alone_loss, packed_loss)


def test_sft_steps_on_a_fixed_batch_reduce_the_loss() -> None:
    trainer = make_trainer(lr=3e-3)
    batch = [pack(random_samples(8, seed=2))]
    losses = [trainer.train_step(step, batch, "sft")["loss"] for step in range(1, 16)]
    assert losses[-1] < 0.8 * losses[0], losses


def test_policy_gradient_steps_raise_logprob_of_positive_advantage_tokens() -> None:
    trainer = make_trainer(lr=3e-3)
    good = Sample([256, 10, 20, 30, 40, 50], 1, 1.0, [0.0] * 6)
    bad = Sample([256, 11, 21, 31, 41, 51], 1, -1.0, [0.0] * 6)
    batch = pack([good, bad])

    def mean_logprob(sample: Sample) -> float:
        one = pack([sample])
        with torch.no_grad():
            logits = trainer.model(one.input_ids[None], one.position_ids[None])[0]
            lp = torch.log_softmax(logits[:-1], -1).gather(-1, one.input_ids[1:, None])
        return float(lp.mean())

    before = mean_logprob(good), mean_logprob(bad)
    for step in range(1, 6):
        # on-policy behaviour logprobs, as inference would report them
        with torch.no_grad():
            logits = trainer.model(
                batch.input_ids[None], batch.position_ids[None], sample_lengths=batch.sample_lengths
            )[0]
            lp = torch.log_softmax(logits[:-1], -1).gather(-1, batch.input_ids[1:, None])[:, 0]
        behaviour = torch.cat([torch.zeros(1), lp]) * batch.loss_mask
        versions = torch.where(batch.loss_mask > 0, step - 1, -1)  # sampled by these weights
        on_policy = MicroBatchData(
            **{**batch.__dict__, "behaviour_logprobs": behaviour, "policy_versions": versions}
        )
        metrics = trainer.train_step(step, [on_policy], "pg")
        assert metrics["mismatch_kl"] == pytest.approx(0.0, abs=1e-6)
    after = mean_logprob(good), mean_logprob(bad)
    assert after[0] > before[0] and after[1] < before[1]


def test_step_reports_metrics_and_uses_sft_learning_rate() -> None:
    trainer = make_trainer(lr=1e-3, sft_lr=5e-4)
    batch = [pack(random_samples(4, seed=3), version=1)]
    sft = trainer.train_step(1, batch, "sft")
    pg = trainer.train_step(2, batch, "pg")
    assert (sft["lr"], pg["lr"]) == (5e-4, 1e-3)
    for key in ("loss", "grad_norm", "tokens", "entropy", "seconds", "tokens_per_s"):
        assert key in pg and key in sft
    assert {"clip_frac", "mismatch_kl"} <= pg.keys()
    assert pg["tokens"] == batch[0].num_tokens
    assert pg["loss_tokens"] == batch[0].num_loss_tokens
    assert pg["grad_norm"] > 0 and pg["skipped"] == 0.0


def test_steps_must_come_in_order() -> None:
    trainer = make_trainer()
    batch = [pack(random_samples(2, seed=4))]
    with pytest.raises(FailedPrecondition, match="expected step 1, got step 2"):
        trainer.train_step(2, batch, "pg")
    trainer.train_step(1, batch, "pg")
    with pytest.raises(FailedPrecondition, match="expected step 2, got step 1"):
        trainer.train_step(1, batch, "pg")


def test_schedule_warms_up_then_decays_and_sft_steps_use_their_own_peak() -> None:
    schedule = {"warmup_steps": 2, "decay": "linear", "decay_steps": 4, "min_lr_ratio": 0.5}
    trainer = make_trainer(lr=1e-3, sft_lr=2e-3, schedule=schedule)
    batch = [pack(random_samples(2, seed=5))]
    lrs = [trainer.train_step(1, batch, "sft")["lr"]]
    lrs += [trainer.train_step(step, batch, "pg")["lr"] for step in range(2, 8)]
    # factors: warmup 1/2, 1; linear decay to 0.5 over 4 steps: 1, 0.875, 0.75, 0.625, 0.5
    expected = [2e-3 * 0.5, 1e-3, 1e-3, 0.875e-3, 0.75e-3, 0.625e-3, 0.5e-3]
    assert lrs == pytest.approx(expected)


def test_sgd_step_is_parameter_minus_lr_times_clipped_gradient() -> None:
    trainer = make_trainer(type="sgd", lr=0.1, max_grad_norm=1e9)
    batch = [pack(random_samples(3, seed=6))]
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.compute_gradients(batch, "sft")
    expected = {n: before[n] - 0.1 * p.grad for n, p in trainer.model.named_parameters()}
    trainer.train_step(1, batch, "sft")
    for name, param in trainer.model.named_parameters():
        torch.testing.assert_close(param.detach(), expected[name])


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
            ],
        ),
    ],
)
def test_bf16_autocast_trains_with_fp32_master_weights(device: str) -> None:
    config = make_trainer().config.model_copy(update={"device": device})
    fp32 = Trainer(config, seed=0, device=torch.device(device))
    bf16 = Trainer(
        config.model_copy(update={"precision": "bf16"}), seed=0, device=torch.device(device)
    )
    batch = [pack(random_samples(4, seed=7))]
    loss32 = fp32.compute_gradients(batch, "sft")["loss"]
    loss16 = bf16.compute_gradients(batch, "sft")["loss"]
    assert float(loss16) != float(loss32)  # the forward really ran in bf16
    assert float(loss16) == pytest.approx(float(loss32), rel=2e-2)
    bf16.train_step(1, batch, "sft")
    params = list(bf16.model.parameters())
    assert all(p.dtype == torch.float32 for p in params)
    state = bf16.optimizer.state[params[0]]
    assert state["exp_avg"].dtype == torch.float32


def test_bf16_on_a_cpu_without_native_bf16_warns_with_the_measured_cost(
    bf16_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = make_trainer().config.model_copy(update={"device": "cpu", "precision": "bf16"})
    with caplog.at_level("WARNING", logger="tidal.trainer.train_step"):
        Trainer(config, seed=0, device=torch.device("cpu"))
    warnings = [r.getMessage() for r in caplog.records if "asks for bf16" in r.getMessage()]
    if bf16_path == "native":
        assert warnings == []
    else:
        (warning,) = warnings
        assert warning.startswith("trainer.precision = 'bf16' asks for bf16")
        assert "x slower than fp32 here" in warning


@pytest.mark.parametrize("dim, expect_bf16_when_native", [(64, False), (256, True)])
def test_auto_precision_is_bf16_only_where_native_and_the_model_is_big_enough(
    bf16_path: str, dim: int, expect_bf16_when_native: bool
) -> None:
    """`precision = "auto"`: the 2M-parameter floor (tiny models run faster in fp32) and the
    CPU's native bf16 both decide; the choice is what the step really runs."""
    base = make_trainer().config
    model = base.model.model_copy(
        update={"dim": dim, "n_layers": 4, "n_heads": 4, "n_kv_heads": 4, "ffn_dim": 4 * dim}
    )
    config = base.model_copy(update={"device": "cpu", "precision": "auto", "model": model})
    trainer = Trainer(config, seed=0, device=torch.device("cpu"))
    params = sum(p.numel() for p in trainer.model.parameters())
    assert (params >= 2_000_000) == expect_bf16_when_native
    assert trainer.bf16 == (expect_bf16_when_native and bf16_path == "native")
    with trainer._autocast():
        assert torch.is_autocast_enabled("cpu") == trainer.bf16


@pytest.mark.parametrize(
    "precision, publish_dtype, expected",
    [
        ("bf16", "auto", torch.bfloat16),
        ("fp32", "auto", torch.float32),
        ("fp32", "bfloat16", torch.bfloat16),
        ("bf16", "float32", torch.float32),
    ],
)
def test_versions_are_published_in_publish_dtype_and_exports_stay_fp32(
    precision: str, publish_dtype: str, expected: torch.dtype
) -> None:
    """ "auto" publishes what the step computes with: a bf16 step's version is exactly the
    bf16 cast of the fp32 master weights its forward used; exports keep the masters."""
    config = make_trainer().config.model_copy(
        update={"device": "cpu", "precision": precision, "publish_dtype": publish_dtype}
    )
    trainer = Trainer(config, seed=0, device=torch.device("cpu"))
    published, exported = trainer.state_dict_for_publish(), trainer.state_dict_for_export()
    assert published.keys() == exported.keys()
    for name, tensor in published.items():
        assert tensor.dtype == expected, name
        assert exported[name].dtype == torch.float32
        assert torch.equal(tensor, exported[name].to(expected))


def test_kl_to_the_frozen_reference_starts_at_zero_and_grows() -> None:
    trainer = make_trainer({"kl": {"coef": 0.05}}, lr=3e-3)
    batch = [pack(random_samples(4, seed=8))]
    first = trainer.train_step(1, batch, "pg")["ref_kl"]
    assert first == pytest.approx(0.0, abs=1e-7)
    for step in range(2, 5):
        last = trainer.train_step(step, batch, "pg")["ref_kl"]
    assert last > 1e-5
    assert trainer.reference is not None
    assert not any(p.requires_grad for p in trainer.reference.parameters())


@pytest.mark.parametrize("share", [False, True], ids=["one-row-per-sample", "shared-prompts"])
def test_scoring_rows_before_the_lm_head_gives_the_full_logits_step(share: bool) -> None:
    """Our models pick the scored rows from the hidden states before the LM head; that is
    the step scoring them from every position's logits (transformers' path) gives."""
    g = torch.Generator().manual_seed(3)
    samples = []
    for _ in range(3):
        prompt = tuple(torch.randint(0, 259, (5,), generator=g).tolist())
        for _ in range(3):
            n = int(torch.randint(2, 7, (), generator=g))
            samples.append(
                TrainSample(
                    prompt,
                    tuple(torch.randint(0, 259, (n,), generator=g).tolist()),
                    advantage=float(torch.randn((), generator=g)),
                    completion_logprobs=tuple((-torch.rand(n, generator=g) * 3).tolist()),
                )
            )
    (per_rank,) = pack_for_ranks(samples, 256, 1, share_prompts=share)
    batches = [micro_batch_from_packed(p) for p in per_rank]
    assert (batches[0].sample_parents is not None) == share
    results = []
    for takes_head in (True, False):
        trainer = make_trainer({"entropy_coef": 0.01})  # the entropy carries gradient too
        assert trainer._takes_head
        trainer._takes_head = takes_head
        sums = trainer.compute_gradients(batches, "pg")
        results.append((sums, grads(trainer)))
    (sums_rows, grads_rows), (sums_full, grads_full) = results
    for name, value in sums_full.items():
        torch.testing.assert_close(sums_rows[name], value, rtol=1e-6, atol=1e-7, msg=name)
    for name, grad in grads_full.items():
        torch.testing.assert_close(grads_rows[name], grad, rtol=1e-5, atol=1e-7, msg=name)
