"""The vLLM backend (`inference.engine = "vllm"`, extra `tidal-inference[vllm]`, GPU only).

The same `Engine` interface over vLLM's `AsyncLLM`, imported only when chosen. vLLM starts
with dummy weights from the first version's config, and every version arrives through
`update_weights`, loaded in each worker by `VllmWeightLoader` (`Worker.reload_weights`).
Written against vLLM 0.32.0 and checked against its source, not yet run on a GPU. Logprobs
are vLLM's processed ones (the sampled distribution); model logprobs are served only where
they equal those. Stop strings are scanned here with our tokenizer, and tokens are tagged
with the version loaded before them on vLLM's ordered output stream.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import torch

from tidal.common.errors import InvalidArgument, ResourceExhausted, Unavailable
from tidal.inference.completion_text import CompletionText
from tidal.inference.engine import Completion, Engine, EngineStatus, FinishReason, TokenScores
from tidal.inference.kv_cache import DEFAULT_MAX_MODEL_LEN, served_length
from tidal.inference.loading import check_tokenizer_fits, describe_shape
from tidal.inference.sampling import SamplingParams
from tidal.inference.sequence import sequence_budget
from tidal.models.hf_folder import write_config
from tidal.text.tokenizer import Tokenizer

INSTALL_HINT = (
    'inference.engine = "vllm" needs vLLM and a CUDA GPU: pip install "tidal-inference[vllm]"'
)


class VllmWeightLoader:
    """vLLM worker extension: the method `update_weights` calls on every worker."""

    def tidal_load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        # vLLM 0.32's `Worker.reload_weights` loads in place through the unwrapped model
        # (`model_runner.model` is a CUDA-graph wrapper without `load_weights` once graphs
        # are captured) and resets the caches derived from the old weights.
        self.reload_weights(  # type: ignore[attr-defined]
            weights_iterator=iter(state_dict.items()), is_checkpoint_format=True
        )
        torch.cuda.synchronize()


def unprocessed(params: SamplingParams) -> bool:
    """Whether sampling uses the model's own distribution (temperature 1, no filter), so the
    processed logprobs vLLM returns are the model's."""
    return (
        params.temperature == 1.0
        and params.top_k <= 0
        and params.top_p >= 1.0
        and params.min_p <= 0.0
    )


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


class VllmEngine(Engine):
    def __init__(
        self,
        *,
        dtype: str,
        max_batch_size: int,
        max_queue: int,
        gpu_memory_utilization: float,
        tokenizer: Tokenizer,
        max_model_len: int | None = None,
        prefix_caching: bool = True,
    ) -> None:
        if not vllm_available():
            raise RuntimeError(INSTALL_HINT)
        self.dtype, self.max_batch_size, self.max_queue = dtype, max_batch_size, max_queue
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_model_len, self.prefix_caching = max_model_len, prefix_caching
        self._served_len = 0  # set when vLLM starts
        self.tokenizer = tokenizer  # ours, for text and the vocabulary check (vLLM has none)
        self._llm: Any = None
        self._hf_config: dict[str, Any] = {}
        self._version = -1
        self._ids = itertools.count()
        self._active = 0
        self._generated = 0
        self._scratch = tempfile.TemporaryDirectory(prefix="tidal-vllm-")

    async def start(self) -> None:
        return None  # vLLM starts with the first weights, when the architecture is known

    async def close(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
        self._scratch.cleanup()

    def _build(self, hf_config: dict[str, Any]) -> Any:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        folder = Path(self._scratch.name)
        write_config(folder, hf_config)  # the architecture; weights come by `load_weights`
        context = int(hf_config.get("max_position_embeddings", 0)) or DEFAULT_MAX_MODEL_LEN
        self._served_len = served_length(context, self.max_model_len)
        args = AsyncEngineArgs(
            model=str(folder),
            skip_tokenizer_init=True,
            load_format="dummy",
            dtype=self.dtype,
            max_num_seqs=self.max_batch_size,
            max_model_len=self._served_len,
            enable_prefix_caching=self.prefix_caching,
            gpu_memory_utilization=self.gpu_memory_utilization,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=f"{__name__}.VllmWeightLoader",
        )
        return AsyncLLM.from_engine_args(args)

    async def update_weights(
        self, version: int, hf_config: dict[str, Any], state_dict: dict[str, torch.Tensor]
    ) -> None:
        check_tokenizer_fits(self.tokenizer, hf_config)
        if self._llm is None:
            self._llm = self._build(hf_config)
            self._hf_config = hf_config
        elif hf_config.get("num_hidden_layers") != self._hf_config.get("num_hidden_layers"):
            raise ValueError("model config changed; vLLM serves one architecture per process")
        await self._llm.collective_rpc("tidal_load_weights", args=(state_dict,))
        self._version = version

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, stream: bool = False
    ) -> AsyncIterator[Completion]:
        if self._llm is None:
            raise Unavailable("no weights loaded yet; retry once the first version is served")
        if params.model_logprobs and not unprocessed(params):
            raise InvalidArgument(
                "sampling.return_model_logprobs",
                "the vLLM backend returns the model's logprobs only for requests sampled at "
                "temperature 1 without top_k, top_p or min_p (vLLM fixes one logprobs mode per "
                'engine); use inference.engine = "native" for them under other settings',
            )
        if params.prompt_logprobs is not None:
            raise InvalidArgument(
                "prompt_logprobs",
                "the vLLM backend scores prompts through Score only (a request of its own)",
            )
        budget = sequence_budget(len(prompt_ids), params.max_tokens, self._served_len)
        if budget < 1:
            raise InvalidArgument(
                "prompt_ids",
                f"a prompt of {len(prompt_ids)} tokens leaves no room to generate: prompt plus "
                f"completion are capped at {self._served_len} tokens (inference.max_model_len)",
            )
        if self._active >= self.max_queue:
            raise ResourceExhausted(f"{self._active} requests in flight (inference.max_queue)")
        request_id = f"tidal-{next(self._ids)}"
        pieces: dict[int, list[tuple[int, float, int]]] = {i: [] for i in range(params.n)}
        texts = {i: CompletionText(self.tokenizer, params.stop) for i in range(params.n)}
        self._active += 1
        drained = False
        try:
            async for output in self._llm.generate(
                {"prompt_token_ids": prompt_ids}, self._sampling(params, budget), request_id
            ):
                for out in output.outputs:
                    text = texts[out.index]
                    if text.finished:  # ended by a stop string; vLLM still runs the sample
                        continue
                    reason = self._take(out, pieces[out.index], text)
                    if stream or reason is not None:
                        if reason is not None:
                            text.finish()
                        tokens, pieces[out.index] = pieces[out.index], []
                        yield self._completion(
                            prompt_ids, out.index, tokens, text.take(), reason,
                            params.model_logprobs,
                        )  # fmt: skip
                if all(t.finished for t in texts.values()):
                    break
            else:
                drained = True
        finally:
            self._active -= 1
            if not drained:  # cancelled, or every sample ended at a stop string first
                await self._llm.abort(request_id)

    async def score(self, token_ids: list[int], *, start: int, top_k: int) -> TokenScores:
        """vLLM's prompt logprobs of a one-token request (vLLM scores a prompt only on the
        way to generating; the token is dropped). vLLM computes prompt logprobs from the
        raw logits and reads no prefix cache for such a request."""
        from vllm import SamplingParams as VllmSampling
        from vllm.sampling_params import RequestOutputKind

        if self._llm is None:
            raise Unavailable("no weights loaded yet; retry once the first version is served")
        if len(token_ids) >= self._served_len:
            raise InvalidArgument(
                "token_ids",
                f"{len(token_ids)} tokens: vLLM scores at most {self._served_len - 1} "
                "(inference.max_model_len less the one token it generates)",
            )
        if not 1 <= start < len(token_ids):
            raise InvalidArgument("start", f"must be in [1, {len(token_ids)}), got {start}")
        sampling = VllmSampling(
            max_tokens=1, temperature=0.0, prompt_logprobs=top_k,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )  # fmt: skip
        version, final = self._version, None
        async for output in self._llm.generate(
            {"prompt_token_ids": token_ids}, sampling, f"tidal-score-{next(self._ids)}"
        ):
            final = output
        if final is None or final.prompt_logprobs is None:
            raise RuntimeError("vLLM answered a scoring request without prompt logprobs")
        rows = final.prompt_logprobs[start:]  # entry p: {token id: Logprob} at position p
        chosen = [row[t] for row, t in zip(rows, token_ids[start:], strict=True)]
        tops = [sorted(row.items(), key=lambda kv: kv[1].rank)[:top_k] for row in rows]
        return TokenScores(
            start=start,
            logprobs=[c.logprob for c in chosen],
            ranks=[c.rank for c in chosen],
            top_ids=[[t for t, _ in top] for top in tops],
            top_logprobs=[[lp.logprob for _, lp in top] for top in tops],
            policy_versions=[version] * len(rows),
        )

    def _sampling(self, params: SamplingParams, max_tokens: int) -> Any:
        """vLLM's parameters. Stop strings stay ours: vLLM runs without a tokenizer
        (`skip_tokenizer_init`), and 0.32's detokenizer-less path ignores `stop` silently
        (`vllm/v1/engine/detokenizer.py`: no tokenizer → the base IncrementalDetokenizer,
        whose `update` never matches), so `CompletionText` scans for them, as natively.
        `max_tokens` is the request's, cut to what `max_model_len` leaves."""
        from vllm import SamplingParams as VllmSampling
        from vllm.sampling_params import RequestOutputKind

        return VllmSampling(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            min_p=params.min_p,
            seed=params.seed,
            max_tokens=max_tokens,  # cut to what max_model_len leaves, as natively
            stop_token_ids=list(params.stop_token_ids),
            logprobs=0,  # the sampled token's logprob only
            output_kind=RequestOutputKind.DELTA,
        )

    def _take(
        self, out: Any, tokens: list[tuple[int, float, int]], text: CompletionText
    ) -> FinishReason | None:
        """Add one output's new tokens; the finish reason once the sample has ended."""
        version = self._version  # tokens arrive in step order, see the module docstring
        for token, logprobs in zip(out.token_ids, out.logprobs or [], strict=False):
            tokens.append((token, logprobs[token].logprob, version))  # processed = the model's
            # when `unprocessed(params)`, the only case model logprobs are served here
            self._generated += 1
            if text.push(token):
                return "stop"  # the token that completed a stop string is kept
        if out.finish_reason is None:
            return None
        return "length" if out.finish_reason == "length" else "stop"

    @staticmethod
    def _completion(
        prompt_ids: list[int],
        index: int,
        tokens: list[tuple[int, float, int]],
        text: str,
        reason: FinishReason | None,
        model_logprobs: bool = False,
    ) -> Completion:
        logprobs = [lp for _, lp, _ in tokens]
        return Completion(
            index=index,
            prompt_ids=prompt_ids,
            token_ids=[t for t, _, _ in tokens],
            logprobs=logprobs,
            model_logprobs=list(logprobs) if model_logprobs else [],
            policy_versions=[v for _, _, v in tokens],
            finish_reason=reason,
            text=text,
        )

    def status(self) -> EngineStatus:
        config = self._hf_config
        return EngineStatus(
            policy_version=self._version,
            running=self._active,
            queued=0,
            generated_tokens=self._generated,
            tokens_per_s=0.0,
            model=f"vllm {_describe(config)}" if config else "",
            vocab_size=config.get("vocab_size", 0),
            max_seq_len=self._served_len,
        )


def _describe(hf_config: dict[str, Any]) -> str:
    """The served folder's family, shape, vocabulary and head, from its `config.json`."""
    return describe_shape(
        hf_config.get("model_type", "?"),
        hf_config.get("num_hidden_layers", 0),
        hf_config.get("hidden_size", 0),
        hf_config.get("vocab_size", 0),
        tied=bool(hf_config.get("tie_word_embeddings")),
    )
