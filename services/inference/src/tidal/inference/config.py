"""Configuration of the inference service (`[inference]`).

pydantic only (no torch import), so the umbrella CLI validates a whole run config and
prints `--help` instantly. The defaults are the embedded CPU run: fp32 on one thread,
because the local stack's four services share two cores.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tidal.common.config import BaseConfig
from tidal.common.sections import ServiceRunConfig


class InferenceConfig(BaseConfig):
    engine: Literal["native", "vllm"] = "native"
    """Generation backend: the native PyTorch engine (CPU and GPU), or vLLM (GPU, needs the
    `tidal-inference[vllm]` extra; see docs/inference.md)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the engine runs; "auto" picks CUDA when available, else CPU."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Weights and KV-cache dtype; logits and logprobs are always computed in fp32."""
    num_threads: int = Field(default=1, gt=0)
    """torch intra-op threads (`torch.set_num_threads`); the local stack shares 2 cores."""
    max_batch_size: int = Field(default=128, gt=0)
    """Most sequences decoded together (KV-cache slots), if `kv_cache_mb` holds that many."""
    kv_cache_mb: float = Field(default=1024.0, gt=0)
    """Memory bound of the KV cache, preallocated at the first load: one slot per running
    sequence, each the model's full context long."""
    max_step_tokens: int = Field(default=4096, gt=0)
    """Token budget of one scheduler step: one per running sequence plus the prompt
    tokens prefilled with it (the first waiting prompt is admitted whenever a slot is free)."""
    packed_weights: bool = True
    """CPU only: run the model's linear layers on oneDNN-prepacked copies of their weights
    (faster matmuls, one extra copy of the weights in memory; see docs/inference.md)."""
    max_queue: int = Field(default=1024, gt=0)
    """Most requests waiting for a batch; beyond it Generate answers RESOURCE_EXHAUSTED."""
    gpu_memory_utilization: float = Field(default=0.8, gt=0, le=1)
    """vLLM only: fraction of GPU memory vLLM may take for weights and KV cache."""
    replica_id: str = ""
    """Name of this replica in weight-sync's registry; empty means "inference-<pid>"."""
    kv_cache: Literal["slots", "paged"] = "slots"
    """Native engine's KV cache: "slots" (one full-context slot per running sequence, the
    fastest on small CPU models) or "paged" (blocks of `block_size` tokens: memory follows
    the tokens held, automatic prefix caching across requests, chunked prefill and
    preemption; what a real model's context needs). See docs/inference.md."""
    block_size: int = Field(default=16, gt=0)
    """Paged cache only: token positions per block."""
    max_model_len: int | None = Field(default=None, gt=0)
    """Paged cache only: longest prompt plus completion served, capping the model's context
    (None: the model's own `max_position_embeddings`)."""
    kv_cache_memory_fraction: float | None = Field(default=None, gt=0, le=1)
    """Paged cache only: size the cache as this fraction of the device's free memory after
    the weights load, instead of `kv_cache_mb`."""
    prefix_caching: bool = True
    """Paged cache only: reuse the cached blocks of equal prompt prefixes across requests
    (GRPO groups, multi-turn episodes); cleared whenever new weights load."""


class InferenceRunConfig(ServiceRunConfig):
    inference: InferenceConfig = InferenceConfig()  # type: ignore[assignment]
