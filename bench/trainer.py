"""Trainer throughput and MFU: a ~50M-parameter Qwen3-style model, sequence length 2048, CPU.

One training step is the trainer's own `Trainer.train_step` (packed forward, policy-
gradient loss, backward, grad-norm clip, AdamW), run under bf16 autocast (fp32 master
weights) and in fp32, side by side in one process; a third row times the model's forward
and backward alone (trivial loss, no optimizer) to show what the loss head and the
optimizer cost on top.

MFU = model FLOPs per second / bf16 matmul peak, the peak measured in this same run
(median of large square bf16 matmuls, best size), so machine drift and CPU sharing hit
numerator and denominator alike. Model FLOPs per token = 6·N (N = parameters, every one
of them used in a matmul; the tied embedding counts once, as the head) + 6·L·H·D·T
(causal attention: QKᵀ and AV over on average T/2 keys, forward + backward).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_seconds, print_table, write_result

from tidal.trainer.batch import MicroBatchData, positions_for
from tidal.trainer.config import ModelConfig, TrainerConfig
from tidal.trainer.train_step import Trainer

SEQ_LEN = 2048
MODEL = ModelConfig(
    family="qwen3", dim=512, n_layers=10, n_heads=8, n_kv_heads=4, head_dim=64, ffn_dim=1536,
    vocab_size=32768, max_seq_len=SEQ_LEN, tie_embeddings=True,
)  # fmt: skip
REPEATS = 3


def matmul_peak(dtype: torch.dtype, sizes: tuple[int, ...] = (1024, 2048, 3072)) -> float:
    """Best median FLOP/s of square matmuls in `dtype`."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        seconds = median_seconds(lambda a=a, b=b: torch.mm(a, b), repeats=5, warmup=2)
        best = max(best, 2 * n**3 / seconds)
    return best


def batch(vocab: int) -> MicroBatchData:
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([SEQ_LEN])
    mask = torch.ones(SEQ_LEN)
    mask[0] = 0  # a sample's first token is never scored
    return MicroBatchData(
        input_ids=torch.randint(0, vocab, (SEQ_LEN,), generator=g),
        position_ids=positions_for(lengths),
        sample_lengths=lengths,
        loss_mask=mask,
        advantages=torch.randn(SEQ_LEN, generator=g),
        behaviour_logprobs=torch.full((SEQ_LEN,), -10.0),
    )


def step_seconds(trainer: Trainer, data: MicroBatchData, bf16: bool) -> float:
    def one() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            trainer.train_step(trainer.trained_step + 1, [data], "pg")

    return median_seconds(one, repeats=REPEATS, warmup=1)


def forward_backward_seconds(trainer: Trainer, data: MicroBatchData) -> float:
    """The model alone under bf16 autocast: forward and backward of a trivial loss."""
    ids, pos = data.input_ids[None], data.position_ids[None]

    def one() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = trainer.model(ids, pos, sample_lengths=data.sample_lengths)  # (1, T, V)
        logits.mean().backward()
        trainer.model.zero_grad(set_to_none=True)

    return median_seconds(one, repeats=REPEATS, warmup=1)


def main() -> None:
    trainer = Trainer(TrainerConfig(model=MODEL), seed=0, device=torch.device("cpu"))
    args = trainer.model.args
    n_params = trainer.num_parameters
    attention = 6 * args.n_layers * args.n_heads * args.head_dim * SEQ_LEN
    flops_per_token = 6 * n_params + attention
    data = batch(args.vocab_size)

    started = time.perf_counter()
    peaks = [matmul_peak(torch.bfloat16)]
    fp32_peak = matmul_peak(torch.float32)
    rows = []
    chunked = Trainer(
        TrainerConfig(model=MODEL.model_copy(update={"fused_lm_head_token_chunk_size": "auto"})),
        seed=0,
        device=torch.device("cpu"),
    )
    steps = (
        ("train step, bf16 autocast", lambda: step_seconds(trainer, data, True)),
        ("train step, bf16, chunked LM head", lambda: step_seconds(chunked, data, True)),
        ("train step, fp32", lambda: step_seconds(trainer, data, False)),
        ("model fwd+bwd only, bf16 autocast", lambda: forward_backward_seconds(trainer, data)),
    )
    for what, measure in steps:
        seconds = measure()
        peaks.append(matmul_peak(torch.bfloat16))  # again, around each measurement
        rows.append(
            {
                "what": what,
                "step_s": seconds,
                "tokens_per_s": SEQ_LEN / seconds,
                "model_tflops": SEQ_LEN * flops_per_token / seconds / 1e12,
            }
        )
    bf16_peak = statistics.median(peaks)
    for row in rows:
        row["mfu_vs_bf16_peak"] = row["model_tflops"] * 1e12 / bf16_peak
    print_table(
        f"trainer step, {n_params / 1e6:.1f}M-param qwen3, seq {SEQ_LEN}, "
        f"{torch.get_num_threads()} threads (bf16 peak {bf16_peak / 1e9:.0f} GFLOP/s)",
        rows,
    )
    best, chunked_row, fp32, model_only = rows
    write_result(
        "trainer",
        config={
            "model": MODEL.model_dump(mode="json", exclude_defaults=True),
            "parameters": n_params,
            "seq_len": SEQ_LEN,
            "step": "Trainer.train_step: packed forward, pg loss, backward, clip, AdamW",
            "flops_per_token": flops_per_token,
            "attention_flops_per_token": attention,
            "repeats": REPEATS,
            "threads": torch.get_num_threads(),
            "wall_s": round(time.perf_counter() - started, 1),
        },
        results=rows,
        summary={
            "mfu": round(best["mfu_vs_bf16_peak"], 4),
            "tokens_per_s": round(best["tokens_per_s"], 1),
            "mfu_chunked_lm_head": round(chunked_row["mfu_vs_bf16_peak"], 4),
            "tokens_per_s_chunked_lm_head": round(chunked_row["tokens_per_s"], 1),
            "mfu_fp32": round(fp32["mfu_vs_bf16_peak"], 4),
            "tokens_per_s_fp32": round(fp32["tokens_per_s"], 1),
            "mfu_model_fwd_bwd_only": round(model_only["mfu_vs_bf16_peak"], 4),
            "bf16_matmul_peak_gflops": round(bf16_peak / 1e9, 1),
            "bf16_peak_samples_gflops": [round(p / 1e9, 1) for p in peaks],
            "fp32_matmul_peak_gflops": round(fp32_peak / 1e9, 1),
        },
    )


if __name__ == "__main__":
    main()
