"""The native PyTorch engine: continuous batching over a paged KV cache with prefix caching.

One scheduler task owns the model and the cache. Each step it applies new weights if
any arrived, plans the step (`scheduler.Scheduler`: admission, chunked prefill,
preemption), runs the extend and decode forwards (`batching.Batcher`) and delivers what
they produced, so requests join and leave the batch at every step. Forwards and weight
swaps run on one dedicated worker thread: the event loop stays free for health checks and
new requests, and torch's intra-op thread team is reused. Only the scheduler touches the
model, so a weight swap never lands mid-forward; running sequences keep their keys and
every token is tagged with the version whose forward produced it. A failing forward fails
only the requests in it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from opentelemetry import context as otel_context
from opentelemetry import trace

from tidal.common.errors import InvalidArgument, ResourceExhausted, Unavailable
from tidal.inference.batching import Batcher
from tidal.inference.decode_attention import choose_decode_attention
from tidal.inference.engine import Completion, Engine, EngineStatus, TokenScores
from tidal.inference.loading import (
    check_compatible,
    check_tokenizer_fits,
    describe_model,
    load_weights,
)
from tidal.inference.packed_linear import choose_linear_kernel
from tidal.inference.sampling import SamplingParams
from tidal.inference.scheduler import Extend, Scheduler
from tidal.inference.sequence import Request, Sequence, sequence_budget
from tidal.models.layers import DecoderLM
from tidal.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

_RATE_WINDOW_S = 10.0


@dataclass
class _PendingWeights:
    version: int
    hf_config: dict[str, Any]
    state_dict: dict[str, torch.Tensor]
    loaded: asyncio.Future[None]


@dataclass(frozen=True)
class BlockCounts:
    held: int
    """Blocks referenced by running (or prefilling) sequences."""
    cached: int
    """Blocks findable in the prefix cache, held or not."""
    total: int
    prefix_hits: int
    """Blocks taken from the prefix cache instead of computed, since the engine started."""
    cache_bytes: int = 0
    """Bytes of keys and values of the whole cache."""


class NativeEngine(Engine):
    def __init__(
        self,
        *,
        device: torch.device,
        dtype: torch.dtype,
        max_batch_size: int,
        max_queue: int,
        max_step_tokens: int,
        kv_cache_mb: float,
        tokenizer: Tokenizer | None = None,
        seed: int = 0,
        packed_weights: bool = True,
        max_model_len: int | None = None,
        kv_cache_memory_fraction: float | None = None,
        block_size: int = 16,
        prefix_caching: bool = True,
        compile_attention: bool = True,
    ) -> None:
        """Options as in `InferenceConfig`; `tokenizer` None serves ids only (no text, no
        stop strings)."""
        self.device, self.dtype = device, dtype
        self.max_model_len = max_model_len  # None: the model's context, capped (kv_cache.py)
        self.kv_cache_memory_fraction = kv_cache_memory_fraction
        self.max_batch_size, self.max_queue = max_batch_size, max_queue
        self.max_step_tokens, self.kv_cache_mb = max_step_tokens, kv_cache_mb
        self.block_size, self.prefix_caching = block_size, prefix_caching
        self.tokenizer = tokenizer
        self.kernel = choose_linear_kernel(device, dtype, packed=packed_weights)
        self.decode_kernel = choose_decode_attention(device, compile_attention=compile_attention)
        log.info("kernels: %s", self.kernels)
        self._rng = random.Random(seed)  # seeds of unseeded requests
        self._batcher: Batcher | None = None  # the model and cache, from the first load on
        self._scheduler: Scheduler | None = None  # built with the batcher
        self._version = -1
        self._model_name = ""
        self._load_error = ""
        self._pending: _PendingWeights | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None  # while started
        self._generated = 0
        self._recent: deque[tuple[float, int]] = deque()  # (monotonic time, tokens) per step

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="engine")
            self._task = asyncio.create_task(self._schedule(), name="native-engine")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._worker is not None:
            self._worker.shutdown(wait=False)  # a forward still running finishes on its own
            self._worker = None
        if self._scheduler is not None:
            closing = Unavailable("the engine is shutting down")
            for request in self._scheduler.requests():
                request.out.put_nowait(closing)
            self._scheduler.clear()

    # -- interface -------------------------------------------------------------------------

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, stream: bool = False
    ) -> AsyncIterator[Completion]:
        max_seq_len = self._admitting().max_seq_len
        if not prompt_ids:
            raise InvalidArgument("prompt_ids", "the prompt is empty")
        if sequence_budget(len(prompt_ids), params.max_tokens, max_seq_len) < 1:
            raise InvalidArgument(
                "prompt_ids",
                f"a prompt of {len(prompt_ids)} tokens leaves no room to generate: prompt plus "
                f"completion are capped at {max_seq_len} tokens (inference.max_model_len)",
            )
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; the engine was built without one")
        async for item in self._run(prompt_ids, params, stream=stream):
            yield item

    async def score(self, token_ids: list[int], *, start: int, top_k: int) -> TokenScores:
        max_seq_len = self._admitting().max_seq_len
        if len(token_ids) > max_seq_len:
            raise InvalidArgument(
                "token_ids",
                f"{len(token_ids)} tokens are more than the {max_seq_len} served "
                "(inference.max_model_len)",
            )
        if not 1 <= start < len(token_ids):
            raise InvalidArgument("start", f"must be in [1, {len(token_ids)}), got {start}")
        # Generating nothing: the request ends when its prompt is computed (`Batcher.extend`).
        params = SamplingParams(
            max_tokens=0, temperature=0.0, prompt_logprobs=top_k, prompt_logprobs_start=start
        )
        async with contextlib.aclosing(self._run(token_ids, params, stream=False)) as run:
            async for completion in run:
                assert completion.prompt_scores is not None, "a scoring request ends scored"
                return completion.prompt_scores
        raise RuntimeError("a scoring request ended without its scores")

    def _admitting(self) -> Scheduler:
        """The scheduler, once the engine runs with weights and its queue has room."""
        if self._task is None:
            raise RuntimeError("NativeEngine.start() was not called")
        if self._scheduler is None:
            raise Unavailable("no weights loaded yet; retry once the first version is served")
        if len(self._scheduler.queue) >= self.max_queue:
            raise ResourceExhausted(
                f"{len(self._scheduler.queue)} requests are queued (inference.max_queue); "
                "retry later"
            )
        return self._scheduler

    async def _run(
        self, prompt_ids: list[int], params: SamplingParams, *, stream: bool
    ) -> AsyncIterator[Completion]:
        """Queue one request and yield what the scheduler delivers for it."""
        assert self._scheduler is not None
        queue = self._scheduler.queue
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        span = trace.get_current_span().get_span_context()
        request = Request(list(prompt_ids), params, seed, span, stream)
        queue.append(request)
        self._wake.set()
        try:
            finished = 0
            while finished < params.n:
                item = await request.out.get()
                if isinstance(item, BaseException):
                    raise item
                finished += item.finish_reason is not None
                yield item
        finally:
            request.cancelled = True

    async def update_weights(
        self, version: int, hf_config: dict[str, Any], state_dict: dict[str, torch.Tensor]
    ) -> None:
        if self._task is None:
            raise RuntimeError("NativeEngine.start() was not called")
        loaded: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._pending is not None:  # only possible with concurrent callers
            self._pending.loaded.set_exception(RuntimeError(f"superseded by version {version}"))
        self._pending = _PendingWeights(version, hf_config, state_dict, loaded)
        self._wake.set()
        await loaded

    @property
    def served_model(self) -> DecoderLM | None:
        """The model answering requests now (None before the first weights load)."""
        return None if self._batcher is None else self._batcher.model

    @property
    def preemptions(self) -> int:
        """Sequences preempted for blocks so far (each recomputed later)."""
        return 0 if self._scheduler is None else self._scheduler.preemptions

    @property
    def block_counts(self) -> BlockCounts:
        """Blocks held by sequences, registered in the prefix cache, in all; prefix hits."""
        if self._batcher is None:
            return BlockCounts(0, 0, 0, 0)
        m = self._batcher.cache.blocks
        return BlockCounts(m.used, m.cached, m.num_blocks, m.hits, self._batcher.cache.nbytes)

    @property
    def kernels(self) -> str:
        """What the model's linears and decode attention run on, for the log and status."""
        return f"{self.kernel.name}; decode attention {self.decode_kernel.name}"

    def status(self) -> EngineStatus:
        now = time.monotonic()
        while self._recent and self._recent[0][0] < now - _RATE_WINDOW_S:
            self._recent.popleft()
        rate = 0.0
        if self._recent:
            span_s = max(now - self._recent[0][0], 1e-3)
            rate = sum(n for _, n in self._recent) / span_s
        if self._batcher is None or self._scheduler is None:
            return EngineStatus(
                self._version, 0, 0, self._generated, rate, "", 0, 0,
                kernels=self.kernels, load_error=self._load_error,
            )  # fmt: skip
        blocks = self._batcher.cache.blocks
        return EngineStatus(
            policy_version=self._version,
            running=len(self._scheduler.running),
            queued=sum(not r.cancelled for r in self._scheduler.queue),
            generated_tokens=self._generated,
            tokens_per_s=rate,
            model=self._model_name,
            vocab_size=self._batcher.model.args.vocab_size,
            max_seq_len=self._batcher.max_seq_len,
            kv_slots_used=len(self._scheduler.running),
            kv_slots_total=self.max_batch_size,
            kv_usage=blocks.used / blocks.num_blocks,
            kernels=self.kernels,
            load_error=self._load_error,
        )

    # -- scheduler -------------------------------------------------------------------------

    def _has_work(self) -> bool:
        return self._pending is not None or (
            self._scheduler is not None and self._scheduler.has_work
        )

    async def _schedule(self) -> None:
        while True:
            if not self._has_work():
                await self._wake.wait()
                self._wake.clear()
            try:
                await self._apply_pending_weights()
                if self._batcher is not None and self._scheduler is not None:
                    await self._step(self._batcher, self._scheduler)
            except Exception:  # a bug here must not silently stop all generation
                log.exception("scheduler step failed; continuing")
                await asyncio.sleep(0.1)

    async def _step(self, batcher: Batcher, scheduler: Scheduler) -> None:
        """Plan, compute prefill chunks, decode one token for every running sequence."""
        scheduler.drop_cancelled()
        decoding = scheduler.decoding()
        work = scheduler.plan_prefill(self.max_step_tokens - len(decoding))
        if work:
            members = [s for w in work for s in (w.leader, *w.followers)]
            sampled = sum(1 + len(w.followers) for w in work if w.sample and w.leader.budget)
            with _prefill_span(work, members):
                if await self._forward(scheduler, batcher.extend, work, members, sampled):
                    scheduler.prefilled(work)
                    self._deliver(scheduler)
        decoding = scheduler.still_decoding(decoding)
        if decoding and await self._forward(
            scheduler, batcher.decode, decoding, decoding, len(decoding)
        ):
            self._deliver(scheduler)

    async def _forward(
        self, scheduler: Scheduler, forward: Any, work: Any, members: list[Sequence], tokens: int
    ) -> bool:
        """One forward in the worker thread; a failure fails the requests in it."""
        try:
            await self._in_worker(forward, work, self._version)
        except Exception as exc:
            log.exception("a forward of %d sequences failed", len(members))
            for request in {s.owner for s in members}:
                request.out.put_nowait(exc)
                request.cancelled = True
            scheduler.drop_cancelled()
            return False
        self._generated += tokens
        self._recent.append((time.monotonic(), tokens))
        return True

    def _deliver(self, scheduler: Scheduler) -> None:
        """Send finished completions (and streamed pieces); release finished sequences."""
        for s in scheduler.running:
            request = s.owner
            if not request.cancelled and (s.done or (request.stream and s.sent < len(s.token_ids))):
                request.out.put_nowait(s.piece(stream=request.stream))
        scheduler.retire_finished()

    # -- weights ---------------------------------------------------------------------------

    async def _apply_pending_weights(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            batcher = await self._in_worker(self._swap, pending)
            if self._scheduler is None:
                self._scheduler = Scheduler(
                    batcher.cache.blocks,
                    max_batch_size=self.max_batch_size,
                    max_seq_len=batcher.max_seq_len,
                    tokenizer=self.tokenizer,
                )
            else:
                self._scheduler.new_weights()
            self._batcher = batcher
            self._version, self._load_error = pending.version, ""
            self._model_name = describe_model(batcher.model)
            log.info("serving policy version %d: %s", pending.version, self._model_name)
            if not pending.loaded.done():  # the caller may have gone away meanwhile
                pending.loaded.set_result(None)
        except Exception as exc:  # a bad version: keep serving the old one
            self._load_error = f"version {pending.version} refused: {exc}"
            log.error("%s", self._load_error)
            if not pending.loaded.done():
                pending.loaded.set_exception(exc)

    async def _in_worker(self, func: Any, *args: Any) -> Any:
        """`func(*args)` on the engine's one worker thread (every model call runs there)."""
        assert self._worker is not None, "the scheduler runs only between start() and close()"
        return await asyncio.get_running_loop().run_in_executor(self._worker, func, *args)

    def _swap(self, pending: _PendingWeights) -> Batcher:
        """Load `pending` into the served model, or build model and cache at the first load."""
        if self.tokenizer is not None:
            check_tokenizer_fits(self.tokenizer, pending.hf_config)
        if self._batcher is not None:
            check_compatible(self._batcher.model, pending.hf_config)
            load_weights(self._batcher.model, pending.state_dict)
            return self._batcher
        return Batcher.build(
            pending.hf_config,
            pending.state_dict,
            device=self.device,
            dtype=self.dtype,
            kernel=self.kernel,
            batch_hint=self.max_batch_size,
            block_size=self.block_size,
            prefix_caching=self.prefix_caching,
            memory_mb=self.kv_cache_mb,
            memory_fraction=self.kv_cache_memory_fraction,
            max_model_len=self.max_model_len,
            decode_kernel=self.decode_kernel,
        )


@contextlib.contextmanager
def _prefill_span(work: list[Extend], members: list[Sequence]) -> Iterator[None]:
    """A root span linked to the requests a prefill serves: it serves many, so it does not
    pretend one of them is its parent."""
    links = [trace.Link(r.span) for r in {s.owner for s in members} if r.span.is_valid]
    with tracer.start_as_current_span(
        "inference.prefill", otel_context.Context(), links=links
    ) as span:
        span.set_attributes(
            {
                "prefill.prompts": len(work),
                "prefill.sequences": len(members),
                "prefill.tokens": sum(w.end - w.start for w in work),
            }
        )
        yield
