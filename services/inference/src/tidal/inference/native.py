"""The native PyTorch engine: a request queue and one scheduler doing continuous batching.

Decisions:
- One scheduler task owns the model and the KV cache. Each iteration it (1) applies new
  weights if any, (2) admits queued samples into free cache slots and prefills them,
  (3) runs one decode step for every running sequence, (4) delivers what finished and
  frees its slots. So requests join and leave the running batch at every step, and a
  long completion never holds the queue back. Forwards and weight swaps run in one
  dedicated worker thread (a one-thread executor, not `asyncio.to_thread`'s shared
  pool), so the event loop keeps answering health checks, GetStatus and new requests
  while torch computes, and every model call comes from the same thread: torch's
  intra-op thread team is reused instead of a new one per pool thread the call lands
  on (7% off a fixed fp32 generation, docs/inference.md).
- Token budget per step (`max_step_tokens`): one step's decode tokens (one per running
  sequence) plus the prompt tokens prefilled with it. The first queued prompt is admitted
  whenever a slot is free, even over budget, so a long prompt cannot starve.
- The n samples of a prompt are admitted together when slots allow and share one prefill
  (`batching.Batcher.prefill`); a request larger than the free slots is admitted in parts.
- Hot reload without locks: `update_weights` parks the new state dict and wakes the
  scheduler, which copies it into the model between two steps (or at once when idle).
  Because only the scheduler touches the model, a swap can never land mid-forward.
  Running sequences continue on the new weights (their KV cache from the old ones is
  kept, as vLLM and PipelineRL do); every token is tagged with the version whose forward
  produced its logits.
- A request whose caller went away is marked cancelled: its queued samples are skipped
  and its running sequences are dropped at the next step, freeing their slots.
- A failing forward fails only the requests in it (each gets the exception); the
  scheduler keeps serving.
- Each prefill is one span, linked to the spans of the requests it admits.
- With a tokenizer, every sample carries its text (`completion_text`), built token by
  token in the worker thread right after sampling, and stop strings are matched on it.
  The tokenizer must fit every version's embedding (`loading.check_tokenizer_fits`); a
  refused version is logged and reported in `EngineStatus.load_error`.
- On CPU the served model's linears run on oneDNN-prepacked weights (`packed_linear.py`,
  `inference.packed_weights`): the decode step is mostly matmuls, and this is what makes
  them faster than the trainer's plain `F.linear`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import torch
from opentelemetry import context as otel_context
from opentelemetry import trace

from tidal.common.errors import InvalidArgument, ResourceExhausted, Unavailable
from tidal.inference.batching import Batcher
from tidal.inference.completion_text import CompletionText
from tidal.inference.engine import Completion, Engine, EngineStatus
from tidal.inference.loading import (
    check_compatible,
    check_tokenizer_fits,
    describe_model,
    load_weights,
)
from tidal.inference.packed_linear import choose_linear_kernel
from tidal.inference.sampling import SamplingParams, draw_uniforms, row_seed
from tidal.inference.sequence import Sequence, sequence_budget
from tidal.models.layers import DecoderLM
from tidal.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

_RATE_WINDOW_S = 10.0


@dataclass(eq=False)
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    span: trace.SpanContext
    stream: bool
    out: asyncio.Queue[Completion | BaseException] = field(default_factory=asyncio.Queue)
    started: int = 0  # samples admitted so far
    cancelled: bool = False


@dataclass
class _PendingWeights:
    version: int
    hf_config: dict[str, Any]
    state_dict: dict[str, torch.Tensor]
    loaded: asyncio.Future[None]


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
    ) -> None:
        self.device, self.dtype = device, dtype
        self.max_model_len = max_model_len  # None: the model's context, capped (kv_cache.py)
        self.kv_cache_memory_fraction = kv_cache_memory_fraction
        self.max_batch_size, self.max_queue = max_batch_size, max_queue
        self.max_step_tokens, self.kv_cache_mb = max_step_tokens, kv_cache_mb
        self.tokenizer = tokenizer  # None: ids only (no text, no stop strings)
        self.kernel = choose_linear_kernel(device, dtype, packed=packed_weights)
        log.info("linear kernels: %s", self.kernel.name)
        self._rng = random.Random(seed)  # seeds of unseeded requests
        self._batcher: Batcher | None = None
        self._version = -1
        self._model_name = ""
        self._load_error = ""
        self._queue: deque[_Request] = deque()
        self._running: list[Sequence] = []
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
        closing = Unavailable("the engine is shutting down")
        for request in {s.owner for s in self._running} | set(self._queue):
            request.out.put_nowait(closing)
        self._queue.clear()
        self._running.clear()

    # -- interface -------------------------------------------------------------------------

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, stream: bool = False
    ) -> AsyncIterator[Completion]:
        if self._task is None:
            raise RuntimeError("NativeEngine.start() was not called")
        if self._batcher is None:
            raise Unavailable("no weights loaded yet; retry once the first version is served")
        if len(self._queue) >= self.max_queue:
            raise ResourceExhausted(
                f"{len(self._queue)} requests are queued (inference.max_queue); retry later"
            )
        max_seq_len = self._batcher.max_seq_len
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
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        span = trace.get_current_span().get_span_context()
        request = _Request(list(prompt_ids), params, seed, span, stream)
        self._queue.append(request)
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

    def status(self) -> EngineStatus:
        now = time.monotonic()
        while self._recent and self._recent[0][0] < now - _RATE_WINDOW_S:
            self._recent.popleft()
        rate = 0.0
        if self._recent:
            span_s = max(now - self._recent[0][0], 1e-3)
            rate = sum(n for _, n in self._recent) / span_s
        if self._batcher is None:
            return EngineStatus(
                self._version, 0, len(self._queue), self._generated, rate, "", 0, 0,
                kernels=self.kernel.name, load_error=self._load_error,
            )  # fmt: skip
        args = self._batcher.model.args
        used, total, usage = self._kv_occupancy(self._batcher)
        return EngineStatus(
            policy_version=self._version,
            running=len(self._running),
            queued=sum(not r.cancelled for r in self._queue),
            generated_tokens=self._generated,
            tokens_per_s=rate,
            model=self._model_name,
            vocab_size=args.vocab_size,
            max_seq_len=self._batcher.max_seq_len,
            kv_slots_used=used,
            kv_slots_total=total,
            kv_usage=usage,
            kernels=self.kernel.name,
            load_error=self._load_error,
        )

    def _kv_occupancy(self, batcher: Batcher) -> tuple[int, int, float]:
        """Slots used, slots, and the fraction of cached positions holding running tokens."""
        cache, max_seq_len = batcher.cache, batcher.max_seq_len
        cached_tokens = sum(s.position + 1 for s in self._running)
        return cache.used, cache.slots, cached_tokens / (cache.slots * max_seq_len)

    # -- scheduler -------------------------------------------------------------------------

    def _has_work(self) -> bool:
        return self._pending is not None or (
            self._batcher is not None and bool(self._queue or self._running)
        )

    async def _schedule(self) -> None:
        while True:
            if not self._has_work():
                await self._wake.wait()
                self._wake.clear()
            try:
                await self._apply_pending_weights()
                if self._batcher is not None:
                    await self._step(self._batcher)
            except Exception:  # a bug here must not silently stop all generation
                log.exception("scheduler step failed; continuing")
                await asyncio.sleep(0.1)

    async def _step(self, batcher: Batcher) -> None:
        """Admit and prefill, decode one token for everything running, deliver."""
        self._drop_cancelled()
        if groups := self._admit(batcher):
            admitted = [s for g in groups for s in g]
            self._running.extend(admitted)
            links = [trace.Link(r.span) for r in {s.owner for s in admitted} if r.span.is_valid]
            # A root span: a prefill serves many requests, so it links to them instead of
            # pretending one of them is its parent.
            with tracer.start_as_current_span(
                "inference.prefill", otel_context.Context(), links=links
            ) as span:
                span.set_attributes(
                    {
                        "prefill.prompts": len(groups),
                        "prefill.sequences": len(admitted),
                        "prefill.tokens": sum(len(g[0].prompt_ids) for g in groups),
                    }
                )
                await self._run(batcher.prefill, groups, admitted)
        decoding = sorted((s for s in self._running if not s.done), key=lambda s: s.slot)
        if decoding:
            await self._run(batcher.decode, decoding, decoding)

    async def _run(self, forward: Any, work: Any, sequences: list[Sequence]) -> None:
        """One forward in a worker thread, then deliveries; a failure fails its requests."""
        try:
            await self._in_worker(forward, work, self._version)
        except Exception as exc:
            log.exception("a forward of %d sequences failed", len(sequences))
            failed = {s.owner for s in sequences}
            for request in failed:
                request.out.put_nowait(exc)
                request.cancelled = True
            self._drop_cancelled()
            return
        self._count_tokens(len(sequences))
        self._deliver()

    def _admit(self, batcher: Batcher) -> list[list[Sequence]]:
        """Queued samples that fit in the free slots and the step's token budget."""
        cache, max_seq_len = batcher.cache, batcher.max_seq_len
        budget = self.max_step_tokens - len(self._running)
        groups: list[list[Sequence]] = []
        tokens = 0
        while self._queue and cache.free > 0:
            request = self._queue[0]
            if request.cancelled:
                self._queue.popleft()
                continue
            prompt_len = len(request.prompt_ids)
            if groups and tokens + prompt_len > budget:
                break
            take = min(request.params.n - request.started, cache.free)
            group_budget = sequence_budget(prompt_len, request.params.max_tokens, max_seq_len)
            groups.append(
                [self._sequence(request, request.started + i, group_budget) for i in range(take)]
            )
            for s in groups[-1]:
                s.slot = cache.allocate()
            request.started += take
            tokens += prompt_len
            if request.started == request.params.n:
                self._queue.popleft()
        return groups

    def _sequence(self, request: _Request, index: int, budget: int) -> Sequence:
        if request.params.greedy:
            uniforms = torch.zeros(budget, dtype=torch.float64)
        else:
            uniforms = draw_uniforms(row_seed(request.seed, index), budget)
        tok, params = self.tokenizer, request.params
        text = None if tok is None else CompletionText(tok, params.stop)
        return Sequence(request, index, request.prompt_ids, params, uniforms, budget, text=text)

    def _drop_cancelled(self) -> None:
        kept = []
        for s in self._running:
            if s.owner.cancelled:
                self._release(s)
            else:
                kept.append(s)
        self._running = kept

    def _release(self, s: Sequence) -> None:
        if self._batcher is not None and s.slot >= 0:
            self._batcher.cache.release(s.slot)
            s.slot = -1

    def _deliver(self) -> None:
        """Send finished completions (and streamed pieces); free finished sequences' slots."""
        kept = []
        for s in self._running:
            request: _Request = s.owner
            if not request.cancelled and (s.done or (request.stream and s.sent < len(s.token_ids))):
                start = s.sent if request.stream else 0
                request.out.put_nowait(
                    Completion(
                        index=s.index,
                        prompt_ids=request.prompt_ids,
                        token_ids=s.token_ids[start:],
                        logprobs=s.logprobs[start:],
                        policy_versions=s.policy_versions[start:],
                        finish_reason=s.finish_reason,
                        model_logprobs=s.model_logprobs[start:],
                        text=s.take_text(),
                    )
                )
                s.sent = len(s.token_ids)
            if s.done:
                self._release(s)
            else:
                kept.append(s)
        self._running = kept

    def _count_tokens(self, tokens: int) -> None:
        self._generated += tokens
        self._recent.append((time.monotonic(), tokens))

    async def _apply_pending_weights(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            self._batcher = await self._in_worker(self._swap, pending)
            self._version, self._load_error = pending.version, ""
            self._model_name = describe_model(self._batcher.model)
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
            max_slots=self.max_batch_size,
            kv_cache_mb=self.kv_cache_mb,
            memory_fraction=self.kv_cache_memory_fraction,
            max_model_len=self.max_model_len,
        )
