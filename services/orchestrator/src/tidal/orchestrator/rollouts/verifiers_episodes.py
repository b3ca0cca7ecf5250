"""A finished `verifiers` episode → one Tidal `Completion`, with each token's policy version.

verifiers' trace keeps, per message node, the exact ids the model saw and which of them it
sampled (with their logprobs), so a single-agent, single-branch episode is one sequence:
the ids before the first sampled token are its prompt, the rest its completion, trained
where sampled. The policy versions are not in the trace: `PolicyVersions` reads them from
each generate reply (its `"tidal"` extension) as the train client's HTTP client receives
it, keyed by the sampled ids and their logprobs, which the trace holds unchanged.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from tidal.orchestrator.completions import Completion

if TYPE_CHECKING:
    import httpx

GENERATE_PATH = "/inference/v1/generate"
_MAX_PENDING = 100_000  # replies whose episode never came back (failed) are dropped oldest first

Key = tuple[tuple[int, ...], tuple[float, ...]]


class PolicyVersions:
    """The policy versions of every generate reply seen, until its episode claims them."""

    def __init__(self) -> None:
        self._pending: OrderedDict[Key, tuple[int, ...]] = OrderedDict()

    async def on_response(self, response: httpx.Response) -> None:
        """An httpx response hook: record the versions of a generate reply's choices."""
        if not response.url.path.endswith(GENERATE_PATH) or response.status_code != 200:
            return
        await response.aread()  # cached: the client reads the same bytes afterwards
        for choice in json.loads(response.content).get("choices", []):
            content = (choice.get("logprobs") or {}).get("content") or []
            key = (tuple(choice["token_ids"]), tuple(float(e["logprob"]) for e in content))
            self._pending[key] = tuple(choice["tidal"]["policy_versions"])
        while len(self._pending) > _MAX_PENDING:
            self._pending.popitem(last=False)

    def claim(self, ids: list[int], logprobs: list[float]) -> tuple[int, ...]:
        key = (tuple(ids), tuple(float(lp) for lp in logprobs))
        versions = self._pending.pop(key, None)
        if versions is None:
            raise RuntimeError(
                f"no generate reply of Tidal inference produced these {len(ids)} sampled "
                "tokens: the environment's client must be verifiers' train client pointed at "
                "inference.http"
            )
        return versions


def _branch(episode: Any) -> Any:
    branches = [b for trace in episode.traces for b in trace.branches if b.trainable]
    if len(episode.traces) != 1 or len(branches) != 1:
        raise ValueError(
            f"verifiers episode of {episode.env.id}: {len(episode.traces)} agent traces with "
            f"{len(branches)} trainable branches; Tidal trains single-agent, single-branch "
            "episodes (no compaction or sub-agents)"
        )
    return branches[0]


def episode_completion(episode: Any, index: int, versions: PolicyVersions) -> Completion:
    """Episode `index` of a group as a Completion (its prompt ids and reward included)."""
    branch = _branch(episode)
    ids, mask, logprobs = branch.token_ids, branch.sampled_mask, branch.logprobs
    if True not in mask:
        errors = "; ".join(e.message for e in episode.errors + episode.traces[0].errors)
        raise RuntimeError(f"verifiers episode of {episode.env.id} sampled nothing: {errors}")
    start = mask.index(True)
    model_versions: list[int] = []
    for node in branch.nodes:
        sampled = [t for t, m in zip(node.token_ids, node.mask, strict=True) if m]
        if sampled:
            model_versions += versions.claim(sampled, node.logprobs)
    calls = branch.calls
    return Completion(
        index=index,
        token_ids=tuple(ids[start:]),
        logprobs=tuple(logprobs[start:]),
        policy_versions=tuple(model_versions),
        stopped=not calls or calls[-1].finish_reason != "length",
        loss_mask=tuple(1.0 if m else 0.0 for m in mask[start:]),
        turns=tuple(str(n.message.content or "") for n in branch.nodes if n.sampled),
        prompt_ids=tuple(ids[:start]),
        reward=float(episode.traces[0].reward),
    )
