"""Configuration of the inference service (`[inference]`).

pydantic only (no torch import), so the umbrella CLI validates a whole run config and
prints `--help` instantly. The defaults are the embedded CPU run: fp32 on one thread,
because the local stack's four services share two cores.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from tidal.common.config.loading import BaseConfig
from tidal.common.config.schema import FIRST
from tidal.common.config.shared import ServiceRunConfig

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def is_loopback_host(host: str) -> bool:
    """An IP address on loopback, or `localhost` when every address it resolves to is.
    Any other name is not loopback here: what it resolves to is not ours to trust."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if host.lower() != "localhost":
        return False
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(found) and all(
        ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]).is_loopback for info in found
    )


class OpenAIHttpConfig(BaseConfig):
    """`[inference.http]`: the OpenAI-compatible HTTP endpoint (docs/inference.md)."""

    enabled: bool = False
    """Serve `/v1/models`, `/v1/completions` and `/v1/chat/completions` beside gRPC."""
    host: str = "127.0.0.1"
    """Address the HTTP server listens on. A loopback IP address (or `localhost`, when it
    resolves to loopback only) unless both `api_key_file` and `tls` are set; any other
    host without both is refused here. `grpc.bind_host` does not apply to it."""
    port: int = Field(default=0, ge=0, le=65535)
    """TCP port; 0 picks a free one (`tidal rl` writes the one it picked into the run's
    config.toml and prints the URL; a standalone service logs it)."""
    served_model_name: str = Field(default="tidal", min_length=1)
    """The `model` name `/v1/models` lists and requests must name (else 404)."""
    api_key_file: Path | None = None
    """File holding the API key every request must send as `Authorization: Bearer <key>`
    (else 401). The server reads it at start and keeps only its sha256 digest. None: no
    key, allowed on loopback only."""
    tls: bool = False
    """Serve HTTPS with the inference role's certificate and key (`security.cert` and
    `security.key`, default `<tls_dir>/inference.pem` and `.key`), which clients verify
    with the run's CA (`<tls_dir>/ca.pem`). Needed, with `api_key_file`, to listen
    beyond loopback."""
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    """Largest request body; a larger one is refused 413 before it is parsed. It bounds
    the memory and JSON-parsing time one request costs; keep it above a few times
    `inference.limits.max_prompt_bytes`, since JSON escapes can be 6 bytes a character."""
    max_body_values: int = Field(default=262144, gt=0)
    """Most JSON values a request body may hold, counted before it is parsed as its `,`,
    `{` and `[` bytes (those inside strings too, so an upper bound); more is refused 413.
    Parsing time and memory grow with the values more than with the bytes, and parsing
    holds the event loop; keep it above `inference.limits.max_prompt_tokens` (a prompt
    of token ids is one value per id)."""
    tool_parser: Literal["auto", "hermes", "llama3_json", "byte"] = "auto"
    """How chat replies are read for the `tools` a request offers (`tidal.text.tool_calls`,
    as `orchestrator.tools.parser`): "auto" picks the served chat template's format."""
    reasoning_parser: Literal["auto", "none", "think"] = "auto"
    """How a chat completion's reasoning is split off into the message's (and the streamed
    deltas') `reasoning_content`: "auto" uses the tokenizer's own markers (a
    `response_template`'s reasoning field in tokenizer_config.json, else `<think>`/`</think>`
    where the vocabulary or chat template has them; none for the byte tokenizer), "think"
    always `<think>…</think>`, "none" returns all text as `content`."""

    @model_validator(mode="after")
    def _loopback_unless_secured(self) -> OpenAIHttpConfig:
        if is_loopback_host(self.host) or (self.api_key_file is not None and self.tls):
            return self
        missing = [
            f"inference.http.{key}"
            for key, unset in (("api_key_file", self.api_key_file is None), ("tls", not self.tls))
            if unset
        ]
        raise ValueError(
            f"{self.host!r} is not a loopback address: the OpenAI endpoint listens beyond "
            f"loopback only with an API key and TLS; set {' and '.join(missing)}, or use a "
            f"loopback address ({', '.join(LOOPBACK_HOSTS)})"
        )

    def url(self, port: int | None = None) -> str:
        """Base URL an OpenAI client takes (`base_url`), e.g. http://127.0.0.1:8000/v1."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{host}:{self.port if port is None else port}/v1"


class RequestLimits(BaseConfig):
    """`[inference.limits]`: caps on one Generate or Score request (gRPC and the OpenAI
    endpoint alike); a request beyond one is refused INVALID_ARGUMENT naming the field.
    See docs/operations.md#limits."""

    max_n: int = Field(default=64, gt=0)
    """Most completions one request may ask for (`sampling.n`)."""
    max_tokens: int = Field(default=32768, gt=0)
    """Most tokens one completion may ask for (`sampling.max_tokens`), on top of the
    model's own context length."""
    max_prompt_bytes: int = Field(default=1024 * 1024, gt=0)
    """Longest text prompt in UTF-8 bytes, checked before it is tokenized."""
    max_prompt_tokens: int = Field(default=131072, gt=0)
    """Most prompt token ids, checked before any id is looked at (the model's context
    length applies too)."""
    max_stop: int = Field(default=16, ge=0)
    """Most stop strings (`sampling.stop`)."""
    max_stop_bytes: int = Field(default=256, gt=0)
    """Longest stop string in UTF-8 bytes."""
    max_stop_token_ids: int = Field(default=1024, ge=0)
    """Most stop token ids (`sampling.stop_token_ids`, before EOS ids are added)."""
    max_temperature: float = Field(default=100.0, gt=0)
    """Highest sampling temperature (0 is greedy; NaN and infinity are refused)."""
    max_top_k: int = Field(default=1 << 20, gt=0)
    """Highest top_k (0 disables it); the served vocabulary size caps it as well."""
    max_logprobs: int = Field(default=20, ge=0)
    """Most alternatives a scoring request may ask for at each position (Score's `top_k`,
    the generate endpoint's `prompt_logprobs`), as vLLM's `max_logprobs`."""
    max_tools: int = Field(default=128, ge=0)
    """Most `tools` one chat request on the OpenAI endpoint may offer (OpenAI's own limit),
    checked before any tool is looked at."""
    max_tools_bytes: int = Field(default=256 * 1024, gt=0)
    """Largest JSON text of a chat request's `tools` (about, in characters), checked before
    their schemas are: checking a schema takes CPU time in proportion to its size."""


class InferenceConfig(BaseConfig):
    engine: Annotated[Literal["native", "vllm"], FIRST] = "native"
    """Generation backend: the native PyTorch engine (CPU and GPU), or vLLM (GPU, needs the
    `tidal-inference[vllm]` extra; see docs/inference.md)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the engine runs; "auto" picks CUDA when available, else CPU."""
    dtype: Literal["float32", "bfloat16", "auto"] = "auto"
    """Weights and KV-cache dtype; logits and logprobs are always computed in fp32. "auto":
    bfloat16 where the device computes it natively (CUDA with bf16; a CPU whose oneDNN bf16
    kernels run), else float32; vLLM gets "auto" as is (the checkpoint's dtype)."""
    num_threads: int = Field(default=1, gt=0)
    """torch intra-op threads (`torch.set_num_threads`); the local stack shares 2 cores."""
    max_batch_size: int = Field(default=128, gt=0)
    """Most sequences running together (decoding or being prefilled)."""
    kv_cache_mb: float = Field(default=1024.0, gt=0)
    """Memory of the native engine's paged KV cache, cut into blocks at the first load.
    Ignored when `kv_cache_memory_fraction` is set. A budget that holds not one
    `max_model_len` sequence is refused at the first load, naming the sizes."""
    max_step_tokens: int = Field(default=4096, gt=0)
    """Token budget of one scheduler step: one per decoding sequence plus the prompt tokens
    prefilled with them; a longer prompt is prefilled in chunks over several steps."""
    packed_weights: bool = True
    """CPU only: run the model's linear layers on oneDNN-prepacked copies of their weights
    (faster matmuls, one extra copy of the weights in memory; see docs/inference.md)."""
    compile_attention: bool = True
    """CPU native engine: decode attention by a C++ kernel (paged_decode.cpp) compiled for
    this CPU when the first weights load (seconds, once; cached on disk), which reads each
    sequence's keys through its block table in fp32. Off: SDPA on keys gathered out of the
    cache first, which at decode's small shapes spends most of its time per (sequence,
    head). Needs a C++ compiler (`CXX`, else g++); if building fails it warns and uses
    SDPA. Applies where torch runs AVX-512 or AVX2 kernels (elsewhere unmeasured, so
    SDPA); ignored on GPUs (see docs/inference.md)."""
    max_queue: int = Field(default=1024, gt=0)
    """Most requests waiting for a batch; beyond it Generate answers RESOURCE_EXHAUSTED."""
    gpu_memory_utilization: float = Field(default=0.8, gt=0, le=1)
    """vLLM only: fraction of GPU memory vLLM may take for weights and KV cache."""
    replica_id: str = ""
    """Name of this replica in weight-sync's registry; empty means
    "inference-<hostname>-<pid>".
    `tidal rl` names its replicas "inference-<i>" (i = 0..replicas-1), or
    "<replica_id>-<i>" when this is set and there are several."""
    replicas: int = Field(default=1, ge=1, le=64)
    """How many inference replicas `tidal rl` (and the SLURM job) starts. Each serves on its
    own port, syncs weights itself, and logs to `logs/inference-<i>.log` (one replica:
    `logs/inference.log`); the orchestrator spreads Generate over all of them and keeps
    going while at least one serves (docs/inference.md, "Several replicas")."""
    block_size: int = Field(default=16, gt=0)
    """Token positions per block of the native engine's KV cache."""
    max_model_len: int | None = Field(default=None, gt=0)
    """Longest prompt plus completion served (native and vLLM). None: the model's
    `max_position_embeddings`, capped at 4096 so a real model's default cache holds
    sequences; above the model's context is an error. A prompt that leaves no room under it
    is refused (INVALID_ARGUMENT on `prompt_ids`); a completion stops at it ("length")."""
    kv_cache_memory_fraction: float | None = Field(default=None, gt=0, le=1)
    """Size the native KV cache as this fraction of the device's memory free once the
    weights are loaded, instead of `kv_cache_mb`."""
    prefix_caching: bool = True
    """Reuse the cached blocks of equal prompt prefixes across requests (GRPO groups,
    multi-turn episodes); cleared whenever new weights load. Also passed to vLLM."""
    model_path: Path | None = None
    """Serve this Hugging Face folder as version 0, with its own tokenizer (or the byte
    tokenizer when it has none), and never follow weight-sync: a fixed model beside the
    policy, such as the judge `tidal rl` starts for an `[orchestrator.task.reward]` judge."""
    http: OpenAIHttpConfig = OpenAIHttpConfig()
    """The OpenAI-compatible HTTP endpoint (off by default)."""
    limits: RequestLimits = RequestLimits()
    """Caps on one generation request (n, max_tokens, prompt, stop strings, sampling)."""


class InferenceRunConfig(ServiceRunConfig):
    inference: InferenceConfig = InferenceConfig()  # type: ignore[assignment]
