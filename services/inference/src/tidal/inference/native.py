"""The native PyTorch engine: a request queue, one scheduler task, static decode batches.

Decisions:
- One scheduler task owns the model. It takes every queued sample (all n of each queued
  request, up to `max_batch_size` sequences) into one `DecodeBatch` and runs it step by
  step, each step in a worker thread (`asyncio.to_thread`), so the event loop keeps
  answering health checks, GetStatus and new requests while torch computes.
- Hot reload without locks: `update_weights` parks the new state dict and wakes the
  scheduler, which copies it into the model between two decode steps (or at once when
  idle). Because only the scheduler touches the model, a swap can never land mid-forward.
  In-flight rows continue on the new weights (their KV cache from the old ones is kept,
  as vLLM and PipelineRL do); the version tags say which tokens came from which policy.
- A request whose caller went away is marked cancelled: queued samples are skipped and
  its running rows stop producing; nothing is delivered to it and nothing fails.
- A batch that raises fails only its own requests (each gets the exception); the
  scheduler keeps serving.
- Each batch is one span, linked to the spans of the requests it serves.
"""

from __future__ import annotations

import asyncio
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

from tidal.common.errors import ResourceExhausted, Unavailable
from tidal.inference.decode import DecodeBatch, Row, row_budget
from tidal.inference.engine import Completion, Engine, EngineStatus
from tidal.inference.loading import build_model, check_compatible, load_weights
from tidal.inference.sampling import SamplingParams, draw_uniforms, row_seed
from tidal.trainer.models.llama.model import LlamaForCausalLM

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

_RATE_WINDOW_S = 10.0


@dataclass(eq=False)
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    span: trace.SpanContext
    out: asyncio.Queue[Completion | BaseException] = field(default_factory=asyncio.Queue)
    started: int = 0  # samples taken into a batch so far
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
        seed: int = 0,
    ) -> None:
        self.device, self.dtype = device, dtype
        self.max_batch_size, self.max_queue = max_batch_size, max_queue
        self._rng = random.Random(seed)  # seeds of unseeded requests
        self._model: LlamaForCausalLM | None = None
        self._version = -1
        self._queue: deque[_Request] = deque()
        self._pending: _PendingWeights | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._running = 0
        self._generated = 0
        self._recent: deque[tuple[float, int]] = deque()  # (monotonic time, tokens) per step

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._schedule(), name="native-engine")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for request in self._queue:
            request.out.put_nowait(Unavailable("the engine is shutting down"))
        self._queue.clear()

    # -- interface -------------------------------------------------------------------------

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[Completion]:
        if self._task is None:
            raise RuntimeError("NativeEngine.start() was not called")
        if self._model is None:
            raise Unavailable("no weights loaded yet; retry once the first version is served")
        if len(self._queue) >= self.max_queue:
            raise ResourceExhausted(
                f"{len(self._queue)} requests are queued (inference.max_queue); retry later"
            )
        if row_budget(len(prompt_ids), params.max_tokens, self._model.args.max_seq_len) == 0:
            raise ValueError(f"a prompt of {len(prompt_ids)} tokens leaves no room to generate")
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        span = trace.get_current_span().get_span_context()
        request = _Request(list(prompt_ids), params, seed, span)
        self._queue.append(request)
        self._wake.set()
        try:
            for _ in range(params.n):
                item = await request.out.get()
                if isinstance(item, BaseException):
                    raise item
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

    def status(self) -> EngineStatus:
        now = time.monotonic()
        while self._recent and self._recent[0][0] < now - _RATE_WINDOW_S:
            self._recent.popleft()
        rate = 0.0
        if self._recent:
            span_s = max(now - self._recent[0][0], 1e-3)
            rate = sum(n for _, n in self._recent) / span_s
        args = self._model.args if self._model is not None else None
        return EngineStatus(
            policy_version=self._version,
            running=self._running,
            queued=sum(not r.cancelled for r in self._queue),
            generated_tokens=self._generated,
            tokens_per_s=rate,
            model=f"llama-{args.n_layers}x{args.dim}" if args else "",
            vocab_size=args.vocab_size if args else 0,
            max_seq_len=args.max_seq_len if args else 0,
        )

    # -- scheduler -------------------------------------------------------------------------

    async def _schedule(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._apply_pending_weights()
                while self._model is not None and (rows := self._take_rows()):
                    await self._run_batch(*rows)
                    await self._apply_pending_weights()
            except Exception:  # a bug here must not silently stop all generation
                log.exception("scheduler step failed; continuing")

    def _take_rows(self) -> tuple[list[Row], list[tuple[_Request, int]]] | None:
        """Up to max_batch_size samples from the front of the queue, with their owners."""
        assert self._model is not None
        rows: list[Row] = []
        owners: list[tuple[_Request, int]] = []
        while self._queue and len(rows) < self.max_batch_size:
            request = self._queue[0]
            if request.cancelled:
                self._queue.popleft()
                continue
            index = request.started
            budget = row_budget(
                len(request.prompt_ids), request.params.max_tokens, self._model.args.max_seq_len
            )
            if request.params.greedy:
                uniforms = torch.zeros(budget, dtype=torch.float64)
            else:
                uniforms = draw_uniforms(row_seed(request.seed, index), budget)
            rows.append(Row(request.prompt_ids, request.params, uniforms, budget))
            owners.append((request, index))
            request.started += 1
            if request.started == request.params.n:
                self._queue.popleft()
        return (rows, owners) if rows else None

    async def _run_batch(self, rows: list[Row], owners: list[tuple[_Request, int]]) -> None:
        assert self._model is not None
        links = [trace.Link(r.span) for r in {r for r, _ in owners} if r.span.is_valid]
        # A root span: a batch serves many requests, so it links to them instead of
        # pretending one of them is its parent.
        root = otel_context.Context()
        with tracer.start_as_current_span("inference.batch", root, links=links) as span:
            span.set_attribute("batch.sequences", len(rows))
            try:
                batch = await asyncio.to_thread(DecodeBatch, self._model, rows)
                self._running = len(rows)
                while not batch.done:
                    finished = await asyncio.to_thread(batch.step, self._version)
                    self._count_tokens(sum(not r.done for r in rows) + len(finished))
                    for i in finished:
                        self._deliver(rows[i], *owners[i])
                    for i, (request, _) in enumerate(owners):
                        if request.cancelled:
                            batch.drop(i)
                    self._running = sum(not r.done for r in rows)
                    await self._apply_pending_weights()  # between decode steps only
                span.set_attribute("batch.steps", batch.steps_done)
            except Exception as exc:
                log.exception("decode batch of %d sequences failed", len(rows))
                span.record_exception(exc)
                for request in {r for r, _ in owners}:
                    request.out.put_nowait(exc)
            finally:
                self._running = 0

    def _deliver(self, row: Row, request: _Request, index: int) -> None:
        if request.cancelled:
            return
        assert row.finish_reason is not None
        request.out.put_nowait(
            Completion(
                index=index,
                prompt_ids=request.prompt_ids,
                token_ids=row.token_ids,
                logprobs=row.logprobs,
                policy_versions=row.policy_versions,
                finish_reason=row.finish_reason,
            )
        )

    def _count_tokens(self, tokens: int) -> None:
        self._generated += tokens
        self._recent.append((time.monotonic(), tokens))

    async def _apply_pending_weights(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            self._model = await asyncio.to_thread(self._swap, pending)
            self._version = pending.version
            log.info("serving policy version %d", pending.version)
            if not pending.loaded.done():  # the caller may have gone away meanwhile
                pending.loaded.set_result(None)
        except Exception as exc:  # a bad version: keep serving the old one
            if not pending.loaded.done():
                pending.loaded.set_exception(exc)

    def _swap(self, pending: _PendingWeights) -> LlamaForCausalLM:
        model = self._model
        if model is None:
            model = build_model(pending.hf_config, device=self.device, dtype=self.dtype)
        else:
            check_compatible(model, pending.hf_config)
        load_weights(model, pending.state_dict)
        return model
