"""Checks of a generation or scoring request, shared by the gRPC servicer and the HTTP endpoints.

Both front ends build domain `SamplingParams` and run the same checks, so a request is
refused with the same limit and message either way; each check takes the field names as
its front end spells them. Checks needing no model run first, those needing the model
(vocabulary, context) after the "no weights yet" check, and every size before the work it
would cost. A prompt plus max_tokens beyond the context is accepted: the completion ends
at the context ("length"). Limits come from `[inference.limits]` (`RequestLimits`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from tidal.common.errors import InvalidArgument, Unavailable
from tidal.inference.config import RequestLimits
from tidal.inference.engine import EngineStatus
from tidal.inference.sampling import SamplingParams

FieldNames = Callable[[str], str]
"""Maps a `SamplingParams` field name to the name the front end's request uses."""


DEFAULT_LIMITS = RequestLimits()
_SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what torch.Generator.manual_seed takes


def check_prompt_text(prompt: str, field: str, limits: RequestLimits = DEFAULT_LIMITS) -> None:
    """Refuse a text prompt longer than `max_prompt_bytes` before it is tokenized."""
    # A str has at most as many characters as UTF-8 bytes, so the character count
    # refuses an absurd prompt without encoding it.
    size = len(prompt) if len(prompt) > limits.max_prompt_bytes else len(prompt.encode())
    if size > limits.max_prompt_bytes:
        raise InvalidArgument(
            field,
            f"{size} bytes is longer than the limit of {limits.max_prompt_bytes} "
            "(inference.limits.max_prompt_bytes)",
        )


def check_sampling(
    params: SamplingParams, names: FieldNames, limits: RequestLimits = DEFAULT_LIMITS
) -> None:
    """Refuse sampling parameters no model could serve or that exceed `limits`,
    naming the field."""
    if not 0 < params.max_tokens <= limits.max_tokens:
        raise InvalidArgument(
            names("max_tokens"),
            f"must be in [1, {limits.max_tokens}] (inference.limits.max_tokens), "
            f"got {params.max_tokens}",
        )
    if not 0 < params.n <= limits.max_n:
        raise InvalidArgument(
            names("n"),
            f"must be in [1, {limits.max_n}] (unset means 1; inference.limits.max_n), "
            f"got {params.n}",
        )
    if not (math.isfinite(params.temperature) and params.temperature >= 0):
        raise InvalidArgument(
            names("temperature"), f"must be a finite number >= 0, got {params.temperature}"
        )
    if params.temperature > limits.max_temperature:
        raise InvalidArgument(
            names("temperature"),
            f"must be <= {limits.max_temperature} (inference.limits.max_temperature), "
            f"got {params.temperature}",
        )
    if not 0 < params.top_p <= 1:  # also refuses NaN
        raise InvalidArgument(
            names("top_p"), f"must be in (0, 1] (unset means 1), got {params.top_p}"
        )
    if not 0 <= params.top_k <= limits.max_top_k:
        raise InvalidArgument(
            names("top_k"),
            f"must be in [0, {limits.max_top_k}] (0 disables; inference.limits.max_top_k), "
            f"got {params.top_k}",
        )
    if not 0 <= params.min_p <= 1:  # also refuses NaN
        raise InvalidArgument(names("min_p"), f"must be in [0, 1] (0 disables), got {params.min_p}")
    if params.seed is not None and not _SEED_RANGE[0] <= params.seed <= _SEED_RANGE[1]:
        raise InvalidArgument(names("seed"), f"must fit in 64 bits, got {params.seed}")
    _check_stops(params, names, limits)


def _check_stops(params: SamplingParams, names: FieldNames, limits: RequestLimits) -> None:
    if len(params.stop) > limits.max_stop:
        raise InvalidArgument(
            names("stop"),
            f"{len(params.stop)} stop strings, the limit is {limits.max_stop} "
            "(inference.limits.max_stop)",
        )
    for i, stop in enumerate(params.stop):
        if not stop:
            raise InvalidArgument(f"{names('stop')}[{i}]", "a stop string must not be empty")
        if len(stop) > limits.max_stop_bytes or len(stop.encode()) > limits.max_stop_bytes:
            raise InvalidArgument(
                f"{names('stop')}[{i}]",
                f"longer than {limits.max_stop_bytes} bytes (inference.limits.max_stop_bytes)",
            )
    if len(params.stop_token_ids) > limits.max_stop_token_ids:
        raise InvalidArgument(
            names("stop_token_ids"),
            f"{len(params.stop_token_ids)} ids (EOS ids included), the limit is "
            f"{limits.max_stop_token_ids} (inference.limits.max_stop_token_ids)",
        )


def check_prompt_count(count: int, field: str, limits: RequestLimits = DEFAULT_LIMITS) -> None:
    """Refuse more prompt token ids than `max_prompt_tokens`, before any id is read."""
    if count > limits.max_prompt_tokens:
        raise InvalidArgument(
            field,
            f"{count} tokens, the limit is {limits.max_prompt_tokens} "
            "(inference.limits.max_prompt_tokens)",
        )


def check_against_model(
    status: EngineStatus,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    *,
    prompt_field: str,
    names: FieldNames,
) -> None:
    """Refuse what the served model cannot take; Unavailable before the first weights.
    Sizes first: the prompt's length is checked before any of its ids."""
    if status.policy_version < 0:
        raise Unavailable("no weights loaded yet; retry once the first version is served")
    vocab, context = status.vocab_size, status.max_seq_len
    if len(prompt_ids) >= context:
        raise InvalidArgument(
            prompt_field,
            f"{len(prompt_ids)} tokens leave no room to generate: the model's "
            f"max_seq_len is {context}",
        )
    for i, token in enumerate(prompt_ids):
        if not 0 <= token < vocab:
            raise InvalidArgument(f"{prompt_field}[{i}]", f"{token} is outside [0, {vocab})")
    if params.top_k > vocab:
        raise InvalidArgument(
            names("top_k"), f"{params.top_k} is above the vocabulary size {vocab} (0 disables)"
        )
    if params.max_tokens > context:
        raise InvalidArgument(
            names("max_tokens"),
            f"{params.max_tokens} is above the model's context length (max_seq_len {context})",
        )
    for i, token in enumerate(params.stop_token_ids):
        if not 0 <= token < vocab:
            raise InvalidArgument(
                f"{names('stop_token_ids')}[{i}]", f"{token} is outside [0, {vocab})"
            )


def check_score(
    status: EngineStatus,
    token_ids: Sequence[int],
    *,
    start: int,
    top_k: int,
    names: FieldNames,
    limits: RequestLimits = DEFAULT_LIMITS,
) -> None:
    """Refuse a scoring request (Score, or prompt logprobs) no model or limit allows; the
    count of ids and `top_k` before the weights, the ids against the served vocabulary."""
    if not 0 <= top_k <= limits.max_logprobs:
        raise InvalidArgument(
            names("top_k"),
            f"must be in [0, {limits.max_logprobs}] (inference.limits.max_logprobs), got {top_k}",
        )
    if not 1 <= start < len(token_ids):
        raise InvalidArgument(
            names("start"), f"must be in [1, {len(token_ids)}) (unset means 1), got {start}"
        )
    if status.policy_version < 0:
        raise Unavailable("no weights loaded yet; retry once the first version is served")
    if len(token_ids) > status.max_seq_len:
        raise InvalidArgument(
            names("token_ids"),
            f"{len(token_ids)} tokens are more than the model's max_seq_len {status.max_seq_len}",
        )
    vocab = status.vocab_size
    for i, token in enumerate(token_ids):
        if not 0 <= token < vocab:
            raise InvalidArgument(f"{names('token_ids')}[{i}]", f"{token} is outside [0, {vocab})")
