"""vLLM's token-in/token-out `/inference/v1/generate` bodies ⇄ domain requests.

The caller renders its own prompt (the `verifiers` train client does, through `renderers`)
and sends `token_ids` plus vLLM's `sampling_params`; the answer is vLLM's
`GenerateResponse`: each choice's `token_ids`, `finish_reason` and chat-style `logprobs`
whose `token` reads `token_id:<id>`, the `"tidal"` extension with each token's policy
version, and (asked by `prompt_logprobs`) vLLM's scores of the prompt's own tokens. Sampling
fields are read by the same table as the OpenAI endpoints; every error names its field as
the body spells it (`sampling_params.temperature`). What this engine does not implement but
would change the result (streaming, multimodal features, priorities, top-k alternatives of
sampled tokens, beam search, guided decoding) is refused, never ignored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tidal.common.errors import InvalidArgument
from tidal.inference.config import RequestLimits
from tidal.inference.engine import Completion, TokenScores
from tidal.inference.openai.protocol import sampling_from_body, tidal_extension
from tidal.inference.request_checks import DEFAULT_LIMITS, check_prompt_count
from tidal.inference.sampling import SamplingParams

SAMPLING = "sampling_params"
_REFUSED = ("features", "content_parts", "kv_transfer_params")


@dataclass(frozen=True)
class GenerateRequest:
    """A parsed generate body: the prompt as sent, how to sample, whether to log-prob."""

    request_id: str | None
    prompt_ids: list[int]
    params: SamplingParams
    want_logprobs: bool

    @staticmethod
    def field_name(name: str) -> str:
        """The body's name of a `SamplingParams` field (for error messages)."""
        return f"{SAMPLING}.{name}"


def _token_ids(body: dict[str, Any], limits: RequestLimits) -> list[int]:
    ids = body.get("token_ids")
    if not isinstance(ids, list) or not ids:
        raise InvalidArgument("token_ids", "must be a non-empty list of token ids")
    check_prompt_count(len(ids), "token_ids", limits)  # before any id is looked at
    for i, t in enumerate(ids):
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise InvalidArgument(
                f"token_ids[{i}]", f"must be a non-negative integer, got {t!r:.40}"
            )
    return ids


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name in _REFUSED:
        if body.get(name) not in (None, {}, []):
            raise InvalidArgument(name, "not supported by this endpoint (text tokens only)")
    if body.get("stream") not in (None, False):
        raise InvalidArgument("stream", "not supported by this endpoint (leave unset)")
    if body.get("priority") not in (None, 0):
        raise InvalidArgument("priority", "not supported: requests are served first come")


def _logprobs(sampling: dict[str, Any]) -> bool:
    value = sampling.get("logprobs")
    if value is None:
        return False
    if isinstance(value, bool) or not isinstance(value, int) or value not in (0, 1):
        raise InvalidArgument(
            f"{SAMPLING}.logprobs",
            f"must be 0 or 1 (the sampled token's logprob; alternatives are not computed), "
            f"got {value!r}",
        )
    return True


def parse_generate(
    body: dict[str, Any],
    *,
    eos_ids: tuple[int, ...],
    max_seq_len: int,
    limits: RequestLimits = DEFAULT_LIMITS,
) -> GenerateRequest:
    """A generate body checked field by field. An unset `max_tokens` is vLLM's default:
    what the model's context leaves after the prompt (within the request limits)."""
    _refuse_unsupported(body)
    prompt_ids = _token_ids(body, limits)
    sampling = body.get(SAMPLING)
    if not isinstance(sampling, dict):
        raise InvalidArgument(SAMPLING, "must be an object of vLLM sampling parameters")
    request_id = body.get("request_id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidArgument("request_id", "must be a string")
    want_logprobs = _logprobs(sampling)
    prompt_logprobs = _prompt_logprobs(sampling, limits)
    sampling = {k: v for k, v in sampling.items() if k not in ("logprobs", "prompt_logprobs")}
    if sampling.get("max_tokens") is None:
        room = max_seq_len - len(prompt_ids)
        sampling["max_tokens"] = max(1, min(room, limits.max_tokens))
    try:
        params = sampling_from_body(sampling, eos_ids=eos_ids, limits=limits)
    except InvalidArgument as e:
        message = str(e).removeprefix(f"{e.field}: ")
        raise InvalidArgument(f"{SAMPLING}.{e.field}", message) from None
    params = dataclasses.replace(params, prompt_logprobs=prompt_logprobs)
    return GenerateRequest(request_id, prompt_ids, params, want_logprobs)


def _prompt_logprobs(sampling: dict[str, Any], limits: RequestLimits) -> int | None:
    value = sampling.get("prompt_logprobs")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{SAMPLING}.prompt_logprobs", f"must be an integer, got {value!r}")
    if not 0 <= value <= limits.max_logprobs:
        raise InvalidArgument(
            f"{SAMPLING}.prompt_logprobs",
            f"must be in [0, {limits.max_logprobs}] (inference.limits.max_logprobs), got {value}",
        )
    return value


def _choice(c: Completion, *, want_logprobs: bool) -> dict[str, Any]:
    logprobs = None
    if want_logprobs:
        logprobs = {
            "content": [
                {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
                for t, lp in zip(c.token_ids, c.logprobs, strict=True)
            ]
        }
    return {
        "index": c.index,
        "token_ids": list(c.token_ids),
        "logprobs": logprobs,
        "finish_reason": c.finish_reason,
        "tidal": tidal_extension(c),
    }


def _prompt_logprobs_body(
    prompt_ids: list[int], scores: TokenScores | None
) -> list[dict[str, Any] | None] | None:
    """vLLM's `prompt_logprobs`: None for the first token, then {id: Logprob} per position
    (the prompt's token and the k most likely, keyed by id as JSON keys must be)."""
    if scores is None:
        return None
    rows: list[dict[str, Any] | None] = [None]
    for i, token in enumerate(prompt_ids[scores.start :]):
        row = {
            str(t): {"logprob": lp, "rank": rank, "decoded_token": f"token_id:{t}"}
            for rank, (t, lp) in enumerate(
                zip(scores.top_ids[i], scores.top_logprobs[i], strict=True), start=1
            )
        }
        row[str(token)] = {
            "logprob": scores.logprobs[i],
            "rank": scores.ranks[i],
            "decoded_token": f"token_id:{token}",
        }
        rows.append(row)
    return rows


def generate_response(
    request_id: str, request: GenerateRequest, completions: list[Completion]
) -> dict[str, Any]:
    """vLLM's `GenerateResponse`, one choice per completion in index order."""
    choices = [_choice(c, want_logprobs=request.want_logprobs) for c in completions]
    return {
        "request_id": request_id,
        "choices": sorted(choices, key=lambda c: c["index"]),
        "prompt_logprobs": _prompt_logprobs_body(
            request.prompt_ids, next((c.prompt_scores for c in completions), None)
        ),
        "kv_transfer_params": None,
    }
