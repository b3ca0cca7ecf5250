"""Checks of a generation request, shared by the gRPC servicer and the OpenAI HTTP endpoint.

Decisions:
- Both front ends build domain `SamplingParams` first and then run the same checks, so a
  request refused over gRPC is refused over HTTP with the same limit and message; only the
  field names differ (`sampling.max_tokens` over gRPC, `max_tokens` over HTTP), which is
  why every check takes the name of each field as its front end spells it (`names`).
- Checks that need no model (`check_sampling`) run before anything else; checks that need
  the model (`check_against_model`: ids within the vocabulary, prompt and max_tokens within
  the context) run after the "no weights yet" check, because the model defines them.
- A prompt plus max_tokens longer than the context is accepted: the completion ends at the
  context ("length"), which lets a caller use one max_tokens for prompts of any length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tidal.common.errors import InvalidArgument, Unavailable
from tidal.inference.engine import EngineStatus
from tidal.inference.sampling import SamplingParams

FieldNames = Callable[[str], str]
"""Maps a `SamplingParams` field name to the name the front end's request uses."""


def check_sampling(params: SamplingParams, names: FieldNames) -> None:
    """Refuse sampling parameters no model could serve, naming the field."""
    if params.max_tokens <= 0:
        raise InvalidArgument(names("max_tokens"), f"must be > 0, got {params.max_tokens}")
    if params.n <= 0:
        raise InvalidArgument(names("n"), f"must be >= 1 (unset means 1), got {params.n}")
    if not params.temperature >= 0:  # also refuses NaN
        raise InvalidArgument(names("temperature"), f"must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise InvalidArgument(
            names("top_p"), f"must be in (0, 1] (unset means 1), got {params.top_p}"
        )
    if params.top_k < 0:
        raise InvalidArgument(names("top_k"), f"must be >= 0 (0 disables), got {params.top_k}")
    if not 0 <= params.min_p <= 1:
        raise InvalidArgument(names("min_p"), f"must be in [0, 1] (0 disables), got {params.min_p}")
    for i, stop in enumerate(params.stop):
        if not stop:
            raise InvalidArgument(f"{names('stop')}[{i}]", "a stop string must not be empty")


def check_against_model(
    status: EngineStatus,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    *,
    prompt_field: str,
    names: FieldNames,
) -> None:
    """Refuse what the served model cannot take; Unavailable before the first weights."""
    if status.policy_version < 0:
        raise Unavailable("no weights loaded yet; retry once the first version is served")
    vocab, context = status.vocab_size, status.max_seq_len
    for i, token in enumerate(prompt_ids):
        if not 0 <= token < vocab:
            raise InvalidArgument(f"{prompt_field}[{i}]", f"{token} is outside [0, {vocab})")
    if len(prompt_ids) >= context:
        raise InvalidArgument(
            prompt_field,
            f"{len(prompt_ids)} tokens leave no room to generate: the model's "
            f"max_seq_len is {context}",
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
