"""Which sequences the native engine runs each step, and the KV-cache blocks they hold.

Every block a prefill will write is allocated when its unit (a request's samples, or one
preempted sequence) is admitted, so a forward never runs out; admission is first come
first served. A decoding sequence entering a new block gets one, and when none is left
the most recently admitted sequence is preempted by recompute: its blocks are released
(full ones stay in the prefix cache) and it waits at the head of the line. A step's
prefill tokens are what `max_step_tokens` leaves after its decodes, so a long prompt is
computed in chunks over several steps; the first prefill of a step always gets one token.
Synchronous bookkeeping only: the engine runs the forwards.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tidal.inference.block_manager import BlockManager, blocks_for
from tidal.inference.sequence import Request, Sequence, sequence_budget
from tidal.text.tokenizer import Tokenizer


@dataclass(eq=False)
class Extend:
    """One sequence's positions `[start, end)` to compute in the next extend forward."""

    leader: Sequence
    start: int
    end: int
    sample: bool
    """Whether `end` completes a fresh prompt: sample the first token of leader and followers."""
    followers: list[Sequence] = field(default_factory=list)
    """The request's other samples, sharing the leader's prompt blocks and first logits."""
    copies: list[tuple[int, int]] = field(default_factory=list)
    """(leader's partial block, follower's own block) to copy once the prompt is computed."""


def target(s: Sequence) -> int:
    """Positions to cache before `s` can go on: its prompt when fresh (then sample),
    every token but the last (which the next decode feeds) when recomputing."""
    return len(s.prompt_ids) if not s.token_ids else s.position


class Scheduler:
    """The waiting line, the running batch, and the blocks of `blocks` each sequence holds."""

    def __init__(
        self,
        blocks: BlockManager,
        *,
        max_batch_size: int,
        max_seq_len: int,
        tokenizer: Tokenizer | None,
    ) -> None:
        self.blocks = blocks
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        self.tokenizer = tokenizer
        self.queue: deque[Request] = deque()
        self.running: list[Sequence] = []
        """Sequences holding blocks: decoding, or in a prefill unit still being computed."""
        self.preempted: deque[Sequence] = deque()
        self.preemptions = 0
        """Sequences preempted so far (each recomputed later)."""
        self._units: dict[Sequence, Extend] = {}  # every member of a prefill in progress

    @property
    def has_work(self) -> bool:
        return bool(self.queue or self.running or self.preempted)

    def requests(self) -> set[Request]:
        """Every request with a sample waiting, running or preempted."""
        owners = {s.owner for s in self.running} | {s.owner for s in self.preempted}
        return owners | set(self.queue)

    def clear(self) -> None:
        self.queue.clear()
        self.running.clear()
        self.preempted.clear()
        self._units.clear()

    # -- each step ---------------------------------------------------------------------------

    def decoding(self) -> list[Sequence]:
        """Sequences ready to decode, each holding the block its next key goes to;
        preempts the most recently admitted sequences when blocks run out."""
        bs = self.blocks.block_size
        ready = [s for s in self.running if s not in self._units and not s.done]
        preempted: set[Sequence] = set()
        for s in ready:
            while s not in preempted and s.position // bs >= len(s.blocks):
                if self.blocks.available == 0:
                    preempted.update(self._preempt(self.running[-1]))
                else:
                    s.blocks.append(self.blocks.allocate())
        return [s for s in ready if s not in preempted]

    def still_decoding(self, decoding: list[Sequence]) -> list[Sequence]:
        """Those of `decoding` a failed or finishing prefill forward left running."""
        running = set(self.running)
        return [s for s in decoding if s in running and not s.done]

    def plan_prefill(self, budget: int) -> list[Extend]:
        """This step's extend work: prefills in progress first, then newly admitted units,
        within `budget` tokens (the first item always gets at least one)."""
        work: list[Extend] = []
        for in_progress in dict.fromkeys(self._units.values()):
            taken = self._take_chunk(in_progress, work, budget)
            if taken is None:
                return work
            budget -= taken
        while (admitted := self._admit_next()) is not None:
            taken = self._take_chunk(admitted, work, budget)
            if taken is None:
                break
            budget -= taken
        return work

    def prefilled(self, work: list[Extend]) -> None:
        """`work` was computed: units whose target is cached go on to decode."""
        for w in work:
            if w.end == target(w.leader):
                for s in (w.leader, *w.followers):
                    self._units.pop(s, None)

    def retire_finished(self) -> None:
        """Release the blocks of finished sequences (their full blocks stay cached)."""
        self._release_running(lambda s: s.done)

    def drop_cancelled(self) -> None:
        for s in [s for s in self._units if s.owner.cancelled]:
            del self._units[s]
        self.preempted = deque(s for s in self.preempted if not s.owner.cancelled)
        self._release_running(lambda s: s.owner.cancelled)

    def _release_running(self, ends: Callable[[Sequence], bool]) -> None:
        """Release the running sequences `ends` picks; the others keep running."""
        kept = []
        for s in self.running:
            if ends(s):
                self._release(s)
            else:
                kept.append(s)
        self.running = kept

    def new_weights(self) -> None:
        """Keys computed by old weights must not serve a new version's prompts, nor may
        blocks computed later on top of them."""
        self.blocks.clear_prefix_cache()
        for s in self.running:
            s.prefix_cacheable = False

    # -- blocks ------------------------------------------------------------------------------

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
            self.running.remove(s)
            self.preempted.appendleft(s)
            self.preemptions += 1
        return members

    def _release(self, s: Sequence) -> None:
        if s.blocks:
            self.blocks.release(s.blocks)
        s.blocks = []

    def _take_chunk(self, unit: Extend, work: list[Extend], budget: int) -> int | None:
        """Schedule the unit's next chunk; the tokens it takes, None when the budget is spent."""
        leader = unit.leader
        remaining = target(leader) - leader.computed
        if remaining == 0:  # all of it came from the prefix cache (a recompute)
            for s in (leader, *unit.followers):
                self._units.pop(s, None)
            return 0
        take = min(remaining, budget if work else max(budget, 1))
        if take <= 0:
            return None
        unit.start, unit.end = leader.computed, leader.computed + take
        unit.sample = not leader.token_ids and unit.end == target(leader)
        work.append(unit)
        return take

    def _admit_next(self) -> Extend | None:
        """Admit the head of the line (a preempted sequence, else a queued request's samples)
        if the batch and the blocks allow; None otherwise."""
        room = self.max_batch_size - len(self.running)
        if room <= 0:
            return None
        if self.preempted:
            unit = self._allocate(self.preempted[0], [])
            if unit is not None:
                self.preempted.popleft()
            return unit
        while self.queue and self.queue[0].cancelled:
            self.queue.popleft()
        if not self.queue:
            return None
        request = self.queue[0]
        budget = sequence_budget(
            len(request.prompt_ids), request.params.max_tokens, self.max_seq_len
        )
        take = min(request.params.n - request.started, room)
        group = [
            Sequence.start(request, request.started + i, budget, self.tokenizer)
            for i in range(take)
        ]
        unit = self._allocate(group[0], group[1:])
        if unit is None:
            return None
        request.started += 1 + len(unit.followers)
        if request.started == request.params.n:
            self.queue.popleft()
        return unit

    def _allocate(self, leader: Sequence, followers: list[Sequence]) -> Extend | None:
        """Blocks for `leader`'s target (prefix hits first) and a tail per follower that fits;
        None (nothing held) when the leader's do not fit."""
        manager, bs = self.blocks, self.blocks.block_size
        end = target(leader)
        # A fresh prompt computes at least its last token: its logits are sampled; and
        # every position whose logits score a prompt token (`prompt_scoring`).
        cacheable = end if leader.token_ids else end - 1
        if leader.owner.scores is not None and not leader.token_ids:
            cacheable = min(cacheable, leader.owner.scores.start - 1)
        hits = manager.lookup(leader.all_ids, cacheable // bs, leader.block_hashes)
        need = blocks_for(end, bs) - len(hits)
        if manager.available < need:
            manager.release(hits)
            return None
        manager.hits += len(hits)
        leader.blocks = hits + [manager.allocate() for _ in range(need)]
        leader.computed = len(hits) * bs
        unit = Extend(leader, leader.computed, leader.computed, sample=False)
        full, tail = divmod(end, bs)
        for f in followers:
            if tail and manager.available < 1:
                break
            f.blocks = [manager.share(b) for b in leader.blocks[:full]]
            if tail:
                f.blocks.append(manager.allocate())
                unit.copies.append((leader.blocks[full], f.blocks[-1]))
            unit.followers.append(f)
        members = [leader, *unit.followers]
        self.running.extend(members)
        for s in members:
            self._units[s] = unit
        return unit
