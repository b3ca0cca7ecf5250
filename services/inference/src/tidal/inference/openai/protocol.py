"""OpenAI request bodies → domain requests, and domain completions → OpenAI choices.

No HTTP here (that is `server`): plain dicts in, `SamplingParams` and dicts out, so
the mapping reads as one table and errors are `InvalidArgument` naming the OpenAI
parameter. A field this engine does not implement but that would change the result is
refused, never ignored. Logprobs are of the sampled token only (no top-k alternatives).
OpenAI's text stops before a stop string, so `StopTrim` cuts it there, streamed pieces
included, while `tidal.token_ids` keeps every generated id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tidal.common.errors import InvalidArgument
from tidal.inference.config import RequestLimits
from tidal.inference.engine import Completion
from tidal.inference.openai.tools import (
    NO_TOOLS,
    ChatTools,
    chat_tools,
    message_tool_fields,
    tool_text,
)
from tidal.inference.request_checks import (
    DEFAULT_LIMITS,
    check_prompt_count,
    check_prompt_text,
    check_sampling,
)
from tidal.inference.sampling import SamplingParams
from tidal.text.tokenizer import Tokenizer

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
_REFUSED = (
    *("echo", "logit_bias", "suffix", "functions", "function_call", "response_format"),
    # vLLM's extensions (top level or in `sampling_params`) that change what is sampled
    *("use_beam_search", "allowed_token_ids", "bad_words", "logits_processors"),
)
_REFUSED_IF_SET = (  # any value asks for something: constrained decoding, prompt logprobs
    *("guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding"),
    *("structured_outputs", "prompt_logprobs", "truncate_prompt_tokens"),
)
_NEUTRAL = {
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "repetition_penalty": 1,
    "length_penalty": 1,
    "min_tokens": 0,
}


@dataclass(frozen=True)
class ParsedRequest:
    """What the handler needs from a body: the prompt ids, how to sample, how to answer."""

    prompt_ids: list[int]
    prompt_field: str
    params: SamplingParams
    stream: bool
    want_logprobs: bool
    include_usage: bool
    max_tokens_field: str = "max_tokens"
    """How this endpoint names the completion length (chat: `max_completion_tokens`)."""
    tools: ChatTools = NO_TOOLS
    """The chat request's tools, and whether its text is read for calls."""

    def field_name(self, name: str) -> str:
        """The OpenAI parameter a `SamplingParams` field came from (for error messages)."""
        return self.max_tokens_field if name == "max_tokens" else name


def _typed(body: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise InvalidArgument(name, f"must be a number, got {value!r}")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise InvalidArgument(name, f"must be {names}, got {type(value).__name__}")
    return value


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = _typed(body, name, (int, float), default)
    try:
        return float(value)
    except OverflowError:  # an integer JSON allows but a float cannot hold
        raise InvalidArgument(name, "is out of range") from None


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name in _REFUSED:
        if body.get(name) not in (None, False, {}, []):
            raise InvalidArgument(name, "not supported by this endpoint")
    for name in _REFUSED_IF_SET:
        if body.get(name) is not None:
            raise InvalidArgument(name, "not supported by this endpoint")
    for name, neutral in _NEUTRAL.items():
        if body.get(name) not in (None, neutral):
            raise InvalidArgument(name, "not supported by this endpoint")
    best_of = body.get("best_of")
    if best_of is not None and best_of != body.get("n", 1):
        raise InvalidArgument("best_of", "not supported by this endpoint (leave unset)")


def _stops(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise InvalidArgument("stop", "must be a string or a list of strings")
    return tuple(stops)


def sampling_from_body(
    body: dict[str, Any],
    *,
    eos_ids: tuple[int, ...],
    max_tokens_key: str = "max_tokens",
    limits: RequestLimits = DEFAULT_LIMITS,
) -> SamplingParams:
    """Domain sampling parameters of an OpenAI body, checked as the gRPC side checks them."""
    _refuse_unsupported(body)
    max_tokens = _typed(body, max_tokens_key, int, None)
    if max_tokens is None and max_tokens_key == "max_completion_tokens":
        max_tokens = _typed(body, "max_tokens", int, None)
    ignore_eos = _typed(body, "ignore_eos", bool, False)
    top_k = _typed(body, "top_k", int, 0)
    stop_token_ids = _typed(body, "stop_token_ids", list, [])
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_token_ids):
        raise InvalidArgument("stop_token_ids", "must be a list of token ids")
    params = SamplingParams(
        max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        temperature=_number(body, "temperature", 1.0),
        top_p=_number(body, "top_p", 1.0),
        top_k=0 if top_k == -1 else top_k,  # vLLM's -1 "off" is our 0; other negatives refused
        n=_typed(body, "n", int, 1),
        seed=_typed(body, "seed", int, None),
        stop_token_ids=tuple(dict.fromkeys([*stop_token_ids, *(() if ignore_eos else eos_ids)])),
        min_p=_number(body, "min_p", 0.0),
        stop=_stops(body),
    )
    check_sampling(params, lambda name: max_tokens_key if name == "max_tokens" else name, limits)
    return params


def _stream_options(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = _typed(body, "stream", bool, False)
    options = _typed(body, "stream_options", dict, {})
    return stream, bool(stream and options.get("include_usage"))


def parse_completion(
    body: dict[str, Any], tokenizer: Tokenizer, limits: RequestLimits = DEFAULT_LIMITS
) -> ParsedRequest:
    """`/v1/completions`: one prompt, as a string or a list of token ids. Sampling is
    checked first and the prompt's size before it is tokenized (cheap checks first)."""
    params = sampling_from_body(body, eos_ids=tokenizer.eos_ids, limits=limits)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        check_prompt_count(len(prompt), "prompt", limits)  # before any id is looked at
    if isinstance(prompt, str) and prompt:
        check_prompt_text(prompt, "prompt", limits)
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=True)
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        prompt_ids = list(prompt)
    else:
        raise InvalidArgument(
            "prompt", "must be one non-empty string or list of token ids (no batches)"
        )
    logprobs = _typed(body, "logprobs", int, None)
    if logprobs is not None and logprobs != 0:
        raise InvalidArgument(
            "logprobs",
            f"top-{logprobs} alternatives are not computed; 0 returns each sampled token's logprob",
        )
    stream, include_usage = _stream_options(body)
    return ParsedRequest(
        prompt_ids=prompt_ids,
        prompt_field="prompt",
        params=params,
        stream=stream,
        want_logprobs=logprobs is not None,
        include_usage=include_usage,
    )


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidArgument("messages", "must be a non-empty list of messages")
    rendered = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidArgument(f"messages[{i}]", "must be an object with a string role")
        content = message.get("content") or ""
        if isinstance(content, list):  # content parts: text only
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                for p in content
            ):
                raise InvalidArgument(f"messages[{i}].content", "only text parts are supported")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise InvalidArgument(f"messages[{i}].content", "must be a string or text parts")
        rendered.append(
            {"role": message["role"], "content": content, **message_tool_fields(i, message)}
        )
    return rendered


def parse_chat(
    body: dict[str, Any], tokenizer: Tokenizer, limits: RequestLimits = DEFAULT_LIMITS
) -> ParsedRequest:
    """`/v1/chat/completions`: messages rendered by the tokenizer's chat template (their
    total text size checked before rendering). The tools' schemas are left to the caller
    (`SchemaChecks`, in a worker process)."""
    params = sampling_from_body(
        body, eos_ids=tokenizer.eos_ids, max_tokens_key="max_completion_tokens", limits=limits
    )
    template_kwargs = _typed(body, "chat_template_kwargs", dict, {})
    tools = chat_tools(body, limits)
    messages = _messages(body)
    text = "".join(m["content"] for m in messages) + tool_text(tools, messages)
    check_prompt_text(text, "messages", limits)
    try:
        prompt_ids = tokenizer.encode_chat(
            messages, add_generation_prompt=True, tools=tools.template_tools(), **template_kwargs
        )
    except Exception as e:  # the template is the model's code: any refusal is the request's
        raise InvalidArgument("messages", f"the chat template refused them: {e}") from e
    want_logprobs = _typed(body, "logprobs", bool, False)
    top = _typed(body, "top_logprobs", int, None)
    if top:
        raise InvalidArgument(
            "top_logprobs",
            "alternatives are not computed; logprobs=true returns the sampled token's",
        )
    stream, include_usage = _stream_options(body)
    return ParsedRequest(
        prompt_ids=prompt_ids,
        prompt_field="messages",
        params=params,
        stream=stream,
        want_logprobs=want_logprobs,
        include_usage=include_usage,
        max_tokens_field="max_completion_tokens",
        tools=tools,
    )


class StopTrim:
    """OpenAI's text of one completion: cut before the first stop string, also when streamed.

    While streaming, the last (longest stop - 1) characters are held back until the text
    shows they do not start a stop string, so the pieces join to the unstreamed text."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._hold = max((len(s) for s in stops), default=1) - 1
        self._text = ""
        self._sent = 0
        self._cut: int | None = None

    def push(self, piece: str, *, last: bool) -> str:
        """The text to send for this piece of the completion."""
        if self._cut is not None:
            return ""
        self._text += piece
        hits = [i for i in (self._text.find(s) for s in self._stops) if i >= 0]
        if hits:
            self._cut = min(hits)
            end = self._cut
        else:
            end = len(self._text) if last else max(self._sent, len(self._text) - self._hold)
        out, self._sent = self._text[self._sent : end], max(self._sent, end)
        return out


def token_strings(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    return [tokenizer.decode([t], skip_special=False) for t in ids]


def completion_logprobs(tokenizer: Tokenizer, c: Completion, offset: int) -> dict[str, Any]:
    """The text completions' `logprobs` object of these tokens (text offsets from `offset`)."""
    tokens = token_strings(tokenizer, c.token_ids)
    offsets, at = [], offset
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": list(c.logprobs),
        "top_logprobs": None,
        "text_offset": offsets,
    }


def chat_logprobs(tokenizer: Tokenizer, c: Completion) -> dict[str, Any]:
    """The chat `logprobs` object: one entry per sampled token, no alternatives."""
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for t, lp in zip(token_strings(tokenizer, c.token_ids), c.logprobs, strict=True)
        ]
    }


def tidal_extension(c: Completion) -> dict[str, Any]:
    """The documented response extension: what produced each token (docs/inference.md)."""
    return {"token_ids": list(c.token_ids), "policy_versions": list(c.policy_versions)}
