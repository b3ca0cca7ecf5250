"""A request queued in the native engine, and one of its samples from admission to its end.

A sequence knows nothing of batches: its tokens depend only on its own seed (a vector of
uniforms drawn up front) and its logits, so it gives the same tokens alone, in a busy
batch, or recomputed after preemption. Its budget keeps prompt plus completion within the
served length. A stop token or stop string ends it at the token that produced it, and
that token is kept, so tokens, logprobs and version tags line up with what was sampled.
Its text is detokenized token by token only where stop strings need it; otherwise when
the text is read (a streamed piece, the final completion), off the decode step.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from opentelemetry import trace

from tidal.inference.completion_text import CompletionText
from tidal.inference.engine import Completion, FinishReason
from tidal.inference.prompt_scoring import ScoreBuffer
from tidal.inference.sampling import SamplingParams, draw_uniforms, row_seed
from tidal.text.tokenizer import Tokenizer


def sequence_budget(prompt_len: int, max_tokens: int, max_seq_len: int) -> int:
    """New tokens a sequence may generate: max_tokens, cut to what the context leaves."""
    return max(0, min(max_tokens, max_seq_len - prompt_len))


@dataclass(eq=False)
class Request:
    """One `generate` call: its prompt, sampling, seed, and the queue its completions go to."""

    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    span: trace.SpanContext
    stream: bool
    out: asyncio.Queue[Completion | BaseException] = field(default_factory=asyncio.Queue)
    started: int = 0
    """Samples admitted so far."""
    cancelled: bool = False
    scores: ScoreBuffer | None = None
    """The prompt's scored tokens, when `params.prompt_logprobs` asks for them."""

    def __post_init__(self) -> None:
        k, start = self.params.prompt_logprobs, self.params.prompt_logprobs_start
        if k is not None:
            self.scores = ScoreBuffer(start, len(self.prompt_ids) - start, k)


@dataclass(eq=False)
class Sequence:
    """One sample of one request, from admission until it finishes."""

    owner: Request
    index: int
    """Which of the request's n samples this is."""
    prompt_ids: list[int]
    params: SamplingParams
    uniforms: list[float]
    """The draw of each step, float64 values (unused when greedy)."""
    budget: int
    text: CompletionText | None = None
    """The completion's text; None for an engine without a tokenizer (ids only)."""
    blocks: list[int] = field(default_factory=list)
    """Block table in the KV cache."""
    computed: int = 0
    """Positions whose keys and values are cached."""
    prefix_cacheable: bool = True
    """Whether its full blocks may enter the prefix cache (False once new weights arrive
    mid-sequence: its keys mix versions)."""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    model_logprobs: list[float] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    sent: int = 0
    """Tokens already streamed to the caller."""
    block_hashes: list[int] = field(default_factory=list)
    """Prefix-cache chain hashes of its leading full blocks, extended as blocks fill."""
    _texted: int = field(default=0, init=False, repr=False)  # tokens pushed to `text`

    @classmethod
    def start(
        cls, request: Request, index: int, budget: int, tokenizer: Tokenizer | None
    ) -> Sequence:
        """Sample `index` of `request`, with its seeded uniforms and (given a tokenizer) text."""
        params = request.params
        if params.greedy:
            uniforms = [0.0] * budget
        else:
            uniforms = draw_uniforms(row_seed(request.seed, index), budget).tolist()
        text = None if tokenizer is None else CompletionText(tokenizer, params.stop)
        return cls(request, index, request.prompt_ids, params, uniforms, budget, text=text)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def position(self) -> int:
        """Cache position of the last token, the one the next decode step feeds."""
        return len(self.prompt_ids) + len(self.token_ids) - 1

    @property
    def all_ids(self) -> list[int]:
        """Prompt followed by the completion so far."""
        return self.prompt_ids + self.token_ids

    def append(self, token: int, logprob: float, model_logprob: float | None, version: int) -> None:
        """Record one sampled token and decide whether the sequence ends with it."""
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        if model_logprob is not None:
            self.model_logprobs.append(model_logprob)
        self.policy_versions.append(version)
        hit_stop_string = bool(self.params.stop) and self._push_text()
        if token in self.params.stop_token_ids or hit_stop_string:
            self.finish_reason = "stop"
        elif len(self.token_ids) >= self.budget:
            self.finish_reason = "length"

    def _push_text(self) -> bool:
        """Detokenize the tokens not yet pushed; True when the newest completed a stop string."""
        if self.text is None:
            return False
        hit = False
        while self._texted < len(self.token_ids):
            hit = self.text.push(self.token_ids[self._texted])
            self._texted += 1
        return hit

    def piece(self, *, stream: bool) -> Completion:
        """What to deliver now: the tokens since the last piece when streaming, else all."""
        start = self.sent if stream else 0
        self.sent = len(self.token_ids)
        return Completion(
            index=self.index,
            prompt_ids=self.prompt_ids,
            token_ids=self.token_ids[start:],
            logprobs=self.logprobs[start:],
            policy_versions=self.policy_versions[start:],
            finish_reason=self.finish_reason,
            model_logprobs=self.model_logprobs[start:],
            text=self.take_text(),
            prompt_scores=(self.owner.scores.result() if self.done and self.owner.scores else None),
        )

    def take_text(self) -> str:
        """The text since the previous call ("" without a tokenizer)."""
        if self.text is None:
            return ""
        self._push_text()
        if self.done:
            self.text.finish()
        return self.text.take()
