"""Trainer throughput and MFU: one packed training step of a Qwen3-style model.

CPU (default): a ~50M-parameter model, sequence 2048. CUDA (`--device cuda`): a
Qwen3-0.6B-shaped model (~0.6B parameters), sequence 4096.

One training step is the trainer's own `Trainer.train_step` (packed forward, policy-
gradient loss, backward, grad-norm clip, AdamW) with fp32 master weights, in the compute
dtype this machine runs natively; a chunked-LM-head row, an fp32 row where that is not
already the dtype, and a row timing the model's forward and backward alone (trivial
loss, no optimizer) show what the loss head and the optimizer cost on top.

Decisions:
- The compute dtype follows the machine (`tidal.models.cpu_features`): bf16 autocast on
  CUDA and on CPUs with native bf16; fp32 on a CPU without it, where a bf16 matmul runs
  ~50-100x slower and the bf16 rows would not finish (measured: >15 min on a 2-core
  AVX2 EPYC). `--dtype` overrides it. MFU is against the matmul peak *of the dtype
  that ran*, and the JSON names it (`summary.compute_dtype`, `summary.peak_dtype`).
- MFU = model FLOPs per second / that peak, the peak measured in this same run (median
  of large square matmuls, best size, again around every row), so machine drift and CPU
  sharing hit numerator and denominator alike. Model FLOPs per token = 6·N (N =
  parameters, every one of them used in a matmul; the tied embedding counts once, as the
  head) + 6·L·H·D·T (causal attention: QKᵀ and AV over on average T/2 keys, forward and
  backward).

`python bench/trainer.py [--device cpu|cuda] [--dtype auto|bf16|fp32]`
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_seconds, print_table, write_result

from tidal.batch.tensors import MicroBatchData, positions_for
from tidal.models.cpu_features import bf16_support
from tidal.trainer.config import ModelConfig, TrainerConfig
from tidal.trainer.train_step import Trainer

CPU_SEQ_LEN, CUDA_SEQ_LEN = 2048, 4096
CPU_MODEL = ModelConfig(
    family="qwen3", dim=512, n_layers=10, n_heads=8, n_kv_heads=4, head_dim=64, ffn_dim=1536,
    vocab_size=32768, max_seq_len=CPU_SEQ_LEN, tie_embeddings=True,
)  # fmt: skip
CUDA_MODEL = ModelConfig(  # the Qwen3-0.6B shape
    family="qwen3", dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128,
    ffn_dim=3072, vocab_size=151936, max_seq_len=CUDA_SEQ_LEN, tie_embeddings=True,
)  # fmt: skip
REPEATS = 3
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def synchronized(fn: Callable[[], object], device: torch.device) -> Callable[[], None]:
    """`fn` that returns only once the device finished its work (CUDA runs asynchronously)."""

    def run() -> None:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return run


def matmul_peak(dtype: torch.dtype, device: torch.device) -> float:
    """Best median FLOP/s of square matmuls in `dtype` on `device`."""
    sizes = (4096, 8192) if device.type == "cuda" else (1024, 2048, 3072)
    if device.type == "cpu" and dtype == torch.bfloat16 and not bf16_support().native:
        sizes = (256,)  # the reference loop: a 1024² product alone takes ~1 s here
    best = 0.0
    for n in sizes:
        a = torch.randn(n, n, dtype=dtype, device=device)
        b = torch.randn(n, n, dtype=dtype, device=device)
        seconds = median_seconds(
            synchronized(lambda a=a, b=b: torch.mm(a, b), device), repeats=5, warmup=2
        )
        best = max(best, 2 * n**3 / seconds)
    return best


def batch(vocab: int, seq_len: int, device: torch.device) -> MicroBatchData:
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([seq_len])
    mask = torch.ones(seq_len)
    mask[0] = 0  # a sample's first token is never scored
    return MicroBatchData(
        input_ids=torch.randint(0, vocab, (seq_len,), generator=g),
        position_ids=positions_for(lengths),
        sample_lengths=lengths,
        loss_mask=mask,
        advantages=torch.randn(seq_len, generator=g),
        behaviour_logprobs=torch.full((seq_len,), -10.0),
    ).to(device)


def step_seconds(trainer: Trainer, data: MicroBatchData) -> float:
    def one() -> None:
        trainer.train_step(trainer.trained_step + 1, [data], "pg")

    return median_seconds(synchronized(one, trainer.device), repeats=REPEATS, warmup=1)


def forward_backward_seconds(trainer: Trainer, data: MicroBatchData, dtype: torch.dtype) -> float:
    """The model alone in `dtype` (autocast for bf16): forward and backward of a trivial loss."""
    ids, pos = data.input_ids[None], data.position_ids[None]
    device = trainer.device

    def one() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = trainer.model(ids, pos, sample_lengths=data.sample_lengths)  # (1, T, V)
        logits.mean().backward()
        trainer.model.zero_grad(set_to_none=True)

    return median_seconds(synchronized(one, device), repeats=REPEATS, warmup=1)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--dtype", choices=("auto", "bf16", "fp32"), default="auto",
        help="compute dtype; auto: bf16 where the device runs it natively, else fp32",
    )  # fmt: skip
    return parser.parse_args(argv)


def compute_dtype(choice: str, device: torch.device) -> str:
    if choice != "auto":
        return choice
    return "bf16" if device.type == "cuda" or bf16_support().native else "fp32"


def main(argv: list[str]) -> None:
    args = parse(argv)
    device = torch.device(args.device)
    dtype_name = compute_dtype(args.dtype, device)
    dtype = DTYPES[dtype_name]
    on_gpu = device.type == "cuda"
    model, seq_len = (CUDA_MODEL, CUDA_SEQ_LEN) if on_gpu else (CPU_MODEL, CPU_SEQ_LEN)

    def trainer(precision: str = dtype_name, **model_update: object) -> Trainer:
        config = TrainerConfig(
            model=model.model_copy(update=model_update), precision=precision, device=device.type
        )
        return Trainer(config, seed=0, device=device)

    main_trainer = trainer()
    margs = main_trainer.model.args
    n_params = main_trainer.num_parameters
    attention = 6 * margs.n_layers * margs.n_heads * margs.head_dim * seq_len
    flops_per_token = 6 * n_params + attention
    data = batch(margs.vocab_size, seq_len, device)

    started = time.perf_counter()
    peaks = [matmul_peak(dtype, device)]
    fp32_peak = matmul_peak(torch.float32, device)
    bf16_peak = matmul_peak(torch.bfloat16, device)
    # The other rows' trainers are built when measured and dropped after: on a GPU three
    # 0.6B models with AdamW state at once would crowd out the activations.
    steps: list[tuple[str, Callable[[], float]]] = [
        (f"train step, {dtype_name}", lambda: step_seconds(main_trainer, data)),
        (
            f"train step, {dtype_name}, chunked LM head",
            lambda: step_seconds(trainer(fused_lm_head_token_chunk_size="auto"), data),
        ),
    ]
    if dtype_name != "fp32":
        steps.append(("train step, fp32", lambda: step_seconds(trainer("fp32"), data)))
    steps.append(
        (
            f"model fwd+bwd only, {dtype_name}",
            lambda: forward_backward_seconds(main_trainer, data, dtype),
        )
    )
    rows = []
    for what, measure in steps:
        seconds = measure()
        peaks.append(matmul_peak(dtype, device))  # again, around each measurement
        rows.append(
            {
                "what": what,
                "step_s": seconds,
                "tokens_per_s": seq_len / seconds,
                "model_tflops": seq_len * flops_per_token / seconds / 1e12,
            }
        )
    peak = statistics.median(peaks)
    for row in rows:
        row[f"mfu_vs_{dtype_name}_peak"] = row["model_tflops"] * 1e12 / peak
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else (
        f"{torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()}"
    )  # fmt: skip
    print_table(
        f"trainer step, {n_params / 1e6:.1f}M-param qwen3, seq {seq_len}, {where} "
        f"({dtype_name} peak {peak / 1e9:.0f} GFLOP/s)",
        rows,
    )
    mfu_key = f"mfu_vs_{dtype_name}_peak"
    by_name = {row["what"]: row for row in rows}
    summary: dict[str, object] = {
        "device": device.type,
        "compute_dtype": dtype_name,
        "peak_dtype": dtype_name,
        "cpu_bf16": None if device.type == "cuda" else bf16_support().reason,
        "mfu": round(rows[0][mfu_key], 4),
        "tokens_per_s": round(rows[0]["tokens_per_s"], 1),
        "mfu_chunked_lm_head": round(rows[1][mfu_key], 4),
        "tokens_per_s_chunked_lm_head": round(rows[1]["tokens_per_s"], 1),
        "mfu_model_fwd_bwd_only": round(rows[-1][mfu_key], 4),
        "peak_gflops": round(peak / 1e9, 1),
        "peak_samples_gflops": [round(p / 1e9, 1) for p in peaks],
        "fp32_matmul_peak_gflops": round(fp32_peak / 1e9, 1),
        "bf16_matmul_peak_gflops": round(bf16_peak / 1e9, 1),
    }
    if "train step, fp32" in by_name and dtype_name != "fp32":
        summary["tokens_per_s_fp32"] = round(by_name["train step, fp32"]["tokens_per_s"], 1)
    if device.type == "cuda":
        summary["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    write_result(
        "trainer" if device.type == "cpu" else "trainer.cuda",
        config={
            "model": model.model_dump(mode="json", exclude_defaults=True),
            "parameters": n_params,
            "seq_len": seq_len,
            "step": "Trainer.train_step: packed forward, pg loss, backward, clip, AdamW",
            "flops_per_token": flops_per_token,
            "attention_flops_per_token": attention,
            "repeats": REPEATS,
            "threads": torch.get_num_threads(),
            "wall_s": round(time.perf_counter() - started, 1),
        },
        results=rows,
        summary=summary,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
