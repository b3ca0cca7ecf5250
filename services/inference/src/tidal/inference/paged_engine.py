"""The native engine over the paged KV cache: block admission, chunked prefill, preemption.

Decisions:
- Same scheduler loop, request queue, delivery, cancellation and hot reload as
  `native.NativeEngine` (this class only replaces the step and what a cache means). It is
  the default (`inference.kv_cache = "paged"`): the default run measured no slower than
  with slots once decode gathered whole blocks (docs/inference.md has the figures).
- Admission by blocks: a unit of work (a fresh request's samples, or one preempted
  sequence) is admitted when the blocks its prompt needs (after prefix-cache hits) plus
  one copied tail block per extra sample are available, and the running batch has room
  (`max_batch_size`). All blocks a prefill will write are allocated at admission, so a
  forward never runs out. Admission is first come first served: the head of the line
  waits for blocks rather than being overtaken.
- Decode growth: before a decode step each sequence entering a new block gets one. When
  none is left the most recently admitted sequence is preempted by *recompute*: its
  blocks are released (its full blocks stay in the prefix cache, so recomputing is often
  mostly hits) and it goes back to the head of the line; re-admitted, it recomputes its
  keys without sampling and decodes on with its own seed's uniforms, so its tokens are
  those it would have produced without preemption. Swapping to host memory is the
  alternative (no recompute, but a copy and host memory per victim); recompute needs no
  second pool and is what the CPU path favours.
- Chunked prefill: one step's tokens are one per decoding sequence plus prefill tokens
  up to `max_step_tokens`; a prompt that does not fit is computed in chunks over several
  steps while the running sequences keep decoding. The first prefill of a step always
  gets at least one token, so nothing starves.
- The prefix cache is cleared when new weights are applied: keys computed by an old
  version must not become a new version's prompt keys; sequences running across the swap
  register no further blocks (theirs attend to old keys). A preempted sequence recomputes
  everything with the new weights, so its blocks are cacheable again. Sequences already running keep
  their keys, as with the slot engine.
- `GetStatus` counts: `kv_slots_*` are running sequences against `max_batch_size`,
  `kv_usage` is the fraction of blocks held.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from tidal.common.errors import Unavailable
from tidal.inference.batching import Batcher
from tidal.inference.block_manager import blocks_for
from tidal.inference.native import NativeEngine, _PendingWeights
from tidal.inference.paged_batching import Extend, PagedBatcher
from tidal.inference.sequence import Sequence, sequence_budget

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


@dataclass(frozen=True)
class BlockCounts:
    held: int
    """Blocks referenced by running (or prefilling) sequences."""
    cached: int
    """Blocks findable in the prefix cache, held or not."""
    total: int
    prefix_hits: int
    """Blocks taken from the prefix cache instead of computed, since the engine started."""


class PagedEngine(NativeEngine):
    """`NativeEngine` whose KV cache is paged blocks with automatic prefix caching."""

    def __init__(
        self,
        *,
        block_size: int = 16,
        prefix_caching: bool = True,
        **kwargs: Any,
    ) -> None:
        """`NativeEngine`'s options, plus the paged cache's (see `InferenceConfig`)."""
        super().__init__(**kwargs)
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._units: dict[Sequence, Extend] = {}  # every member of a prefill in progress
        self._preempted: deque[Sequence] = deque()
        self.preemptions = 0
        """Sequences preempted so far (each recomputed later)."""

    @property
    def paged(self) -> PagedBatcher | None:
        """The batcher (model and block cache) once the first weights are loaded."""
        return self._batcher if isinstance(self._batcher, PagedBatcher) else None

    @property
    def block_counts(self) -> BlockCounts:
        """Blocks held by sequences, registered in the prefix cache, in all; prefix hits."""
        if (batcher := self.paged) is None:
            return BlockCounts(0, 0, 0, 0)
        m = batcher.paged.blocks
        return BlockCounts(held=m.used, cached=m.cached, total=m.num_blocks, prefix_hits=m.hits)

    # -- lifecycle and status ---------------------------------------------------------------

    async def close(self) -> None:
        closing = Unavailable("the engine is shutting down")
        for request in {s.owner for s in self._preempted}:
            request.out.put_nowait(closing)
        self._preempted.clear()
        self._units.clear()
        await super().close()

    def _kv_occupancy(self, batcher: Batcher) -> tuple[int, int, float]:
        """Running sequences against `max_batch_size`, and the fraction of blocks held."""
        assert isinstance(batcher, PagedBatcher)
        manager = batcher.paged.blocks
        return len(self._running), self.max_batch_size, manager.used / manager.num_blocks

    def _has_work(self) -> bool:
        return super()._has_work() or (self._batcher is not None and bool(self._preempted))

    # -- the step ---------------------------------------------------------------------------

    async def _step(self, batcher: Batcher) -> None:
        assert isinstance(batcher, PagedBatcher)
        self._drop_cancelled()
        decoding = self._grow_decoding(batcher)
        work = self._plan_prefill(batcher, budget=self.max_step_tokens - len(decoding))
        if work:
            members = [s for w in work for s in (w.leader, *w.followers)]
            sampled = sum(1 + len(w.followers) for w in work if w.sample)
            links = [trace.Link(r.span) for r in {s.owner for s in members} if r.span.is_valid]
            # A root span linked to the requests it serves, as the slot engine's prefill.
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
                done = await self._forward(batcher.extend, work, members, sampled)
            if done:
                for w in work:
                    if w.end == self._target(w.leader):
                        for s in (w.leader, *w.followers):
                            self._units.pop(s, None)
        running = set(self._running)
        decoding = [s for s in decoding if s in running and not s.done]
        if decoding:
            await self._forward(batcher.decode, decoding, decoding, len(decoding))

    async def _forward(self, forward: Any, work: Any, members: list[Sequence], tokens: int) -> bool:
        """One forward in the worker thread, then deliveries; a failure fails its requests."""
        try:
            await self._in_worker(forward, work, self._version)
        except Exception as exc:
            log.exception("a forward of %d sequences failed", len(members))
            for request in {s.owner for s in members}:
                request.out.put_nowait(exc)
                request.cancelled = True
            self._drop_cancelled()
            return False
        self._count_tokens(tokens)
        self._deliver()
        return True

    def _grow_decoding(self, batcher: PagedBatcher) -> list[Sequence]:
        """Sequences ready to decode, each holding the block its next key goes to;
        preempts the most recently admitted sequences when blocks run out."""
        manager, bs = batcher.paged.blocks, batcher.paged.block_size
        ready = [s for s in self._running if s not in self._units and not s.done]
        preempted: set[Sequence] = set()
        for s in ready:
            while s not in preempted and s.position // bs >= len(s.blocks):
                if manager.available == 0:
                    preempted.update(self._preempt(self._running[-1]))
                else:
                    s.blocks.append(manager.allocate())
        return [s for s in ready if s not in preempted]

    def _preempt(self, victim: Sequence) -> list[Sequence]:
        """Release the blocks of `victim` (and of its whole prefill unit) for recompute;
        the sequences preempted."""
        unit = self._units.get(victim)
        members = [victim] if unit is None else [unit.leader, *unit.followers]
        for s in reversed(members):
            s.prefix_cacheable = True  # recomputed from scratch with the weights of then
            self._units.pop(s, None)
            self._release(s)
            s.computed = 0
            self._running.remove(s)
            self._preempted.appendleft(s)
            self.preemptions += 1
        return members

    def _release(self, s: Sequence) -> None:
        if (batcher := self.paged) is not None and s.blocks:
            batcher.paged.blocks.release(s.blocks)
        s.blocks = []

    def _drop_cancelled(self) -> None:
        for s in [s for s in self._units if s.owner.cancelled]:
            del self._units[s]
        self._preempted = deque(s for s in self._preempted if not s.owner.cancelled)
        super()._drop_cancelled()

    # -- admission --------------------------------------------------------------------------

    @staticmethod
    def _target(s: Sequence) -> int:
        """Positions to cache before `s` can go on: its prompt when fresh (then sample),
        every token but the last (which the next decode feeds) when recomputing."""
        return len(s.prompt_ids) if not s.token_ids else s.position

    def _plan_prefill(self, batcher: PagedBatcher, *, budget: int) -> list[Extend]:
        """This step's extend work: prefills in progress first, then newly admitted units,
        within `budget` tokens (the first item always gets at least one)."""
        work: list[Extend] = []
        for unit in dict.fromkeys(self._units.values()):
            taken = self._take_chunk(unit, work, budget)
            if taken is None:
                return work
            budget -= taken
        while (unit := self._admit_next(batcher)) is not None:
            taken = self._take_chunk(unit, work, budget)
            if taken is None:
                break
            budget -= taken
        return work

    def _take_chunk(self, unit: Extend, work: list[Extend], budget: int) -> int | None:
        """Schedule the unit's next chunk; the tokens it takes, None when the budget is spent."""
        leader = unit.leader
        remaining = self._target(leader) - leader.computed
        if remaining == 0:  # all of it came from the prefix cache (a recompute)
            for s in (leader, *unit.followers):
                self._units.pop(s, None)
            return 0
        take = min(remaining, budget if work else max(budget, 1))
        if take <= 0:
            return None
        unit.start, unit.end = leader.computed, leader.computed + take
        unit.sample = not leader.token_ids and unit.end == self._target(leader)
        work.append(unit)
        return take

    def _admit_next(self, batcher: PagedBatcher) -> Extend | None:
        """Admit the head of the line (a preempted sequence, else a queued request's samples)
        if the batch and the blocks allow; None otherwise."""
        room = self.max_batch_size - len(self._running)
        if room <= 0:
            return None
        if self._preempted:
            leader = self._preempted[0]
            unit = self._allocate(batcher, leader, [])
            if unit is not None:
                self._preempted.popleft()
            return unit
        while self._queue and self._queue[0].cancelled:
            self._queue.popleft()
        if not self._queue:
            return None
        request = self._queue[0]
        budget = sequence_budget(
            len(request.prompt_ids), request.params.max_tokens, batcher.max_seq_len
        )
        take = min(request.params.n - request.started, room)
        group = [self._sequence(request, request.started + i, budget) for i in range(take)]
        unit = self._allocate(batcher, group[0], group[1:])
        if unit is None:
            return None
        request.started += 1 + len(unit.followers)
        if request.started == request.params.n:
            self._queue.popleft()
        return unit

    def _allocate(
        self, batcher: PagedBatcher, leader: Sequence, followers: list[Sequence]
    ) -> Extend | None:
        """Blocks for `leader`'s target (prefix hits first) and a tail per follower that fits;
        None (nothing held) when the leader's do not fit."""
        manager, bs = batcher.paged.blocks, batcher.paged.block_size
        target = self._target(leader)
        # A fresh prompt computes at least its last token: its logits are sampled.
        cacheable = target if leader.token_ids else target - 1
        hits = manager.lookup(leader.all_ids, cacheable // bs)
        need = blocks_for(target, bs) - len(hits)
        if manager.available < need:
            manager.release(hits)
            return None
        manager.hits += len(hits)
        leader.blocks = hits + [manager.allocate() for _ in range(need)]
        leader.computed = len(hits) * bs
        unit = Extend(leader, leader.computed, leader.computed, sample=False)
        full, tail = divmod(target, bs)
        for f in followers:
            if tail and manager.available < 1:
                break
            f.blocks = [manager.share(b) for b in leader.blocks[:full]]
            if tail:
                f.blocks.append(manager.allocate())
                unit.copies.append((leader.blocks[full], f.blocks[-1]))
            unit.followers.append(f)
        members = [leader, *unit.followers]
        self._running.extend(members)
        for s in members:
            self._units[s] = unit
        return unit

    # -- weights ----------------------------------------------------------------------------

    def _swap(self, pending: _PendingWeights) -> Batcher:
        if self._batcher is not None:
            batcher = super()._swap(pending)
            assert isinstance(batcher, PagedBatcher)
            batcher.paged.blocks.clear_prefix_cache()  # old keys must not serve a new version
            for s in self._running:  # nor blocks computed later on top of them
                s.prefix_cacheable = False
            return batcher
        batcher = PagedBatcher.build_paged(
            pending.hf_config,
            pending.state_dict,
            device=self.device,
            dtype=self.dtype,
            kernel=self.kernel,
            batch_hint=self.max_batch_size,
            block_size=self.block_size,
            memory_mb=self.kv_cache_mb,
            memory_fraction=self.kv_cache_memory_fraction,
            max_model_len=self.max_model_len,
        )
        batcher.paged.blocks.prefix_caching = self.prefix_caching
        return batcher
