"""OpenAI bodies → domain requests, and the endpoint's config (no server, no model)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tidal.common.errors import InvalidArgument
from tidal.inference.config import InferenceConfig, OpenAIHttpConfig
from tidal.inference.openai_protocol import StopTrim, parse_completion, sampling_from_body
from tidal.text.byte import ByteTokenizer


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "example.com"])
def test_a_non_loopback_http_host_is_a_config_error(host: str) -> None:
    with pytest.raises(ValidationError, match="not a loopback address: the OpenAI endpoint"):
        InferenceConfig.model_validate({"http": {"enabled": True, "host": host}})


def test_the_endpoint_is_off_and_on_loopback_by_default() -> None:
    http = InferenceConfig().http
    assert (http.enabled, http.host) == (False, "127.0.0.1")
    assert OpenAIHttpConfig(host="::1", port=8000).url() == "http://[::1]:8000/v1"


@pytest.mark.parametrize("split", [1, 2, 3, 5])
def test_streamed_stop_trim_joins_to_the_whole_text_cut_before_the_stop(split: int) -> None:
    text, stops = "Hello world. END and more", ("END", "zz")
    whole = StopTrim(stops).push(text, last=True)
    trim = StopTrim(stops)
    pieces = [text[i : i + split] for i in range(0, len(text), split)]
    streamed = "".join(trim.push(p, last=i == len(pieces) - 1) for i, p in enumerate(pieces))
    assert whole == streamed == "Hello world. "


def test_held_back_text_is_released_when_no_stop_string_completes() -> None:
    trim = StopTrim(("END",))
    assert trim.push("abcE", last=False) == "ab"  # len("END") - 1 characters held back
    assert trim.push("N", last=True) == "cEN"


def test_sampling_fields_are_checked_like_grpc_and_named_as_openai_does() -> None:
    with pytest.raises(
        InvalidArgument,
        match=r"^max_tokens: must be in \[1, 32768\] \(inference.limits.max_tokens\), got 0$",
    ):
        sampling_from_body({"max_tokens": 0}, eos_ids=())
    with pytest.raises(InvalidArgument, match=r"^max_completion_tokens: must be in \[1, "):
        sampling_from_body(
            {"max_completion_tokens": 0}, eos_ids=(), max_tokens_key="max_completion_tokens"
        )
    with pytest.raises(InvalidArgument, match=r"^temperature: must be a number"):
        sampling_from_body({"temperature": True}, eos_ids=())
    with pytest.raises(InvalidArgument, match=r"^presence_penalty: not supported"):
        sampling_from_body({"presence_penalty": 0.5}, eos_ids=())


def test_eos_ends_a_completion_unless_ignore_eos() -> None:
    assert sampling_from_body({}, eos_ids=(7,)).stop_token_ids == (7,)
    assert sampling_from_body({"ignore_eos": True}, eos_ids=(7,)).stop_token_ids == ()


def test_a_prompt_is_text_or_ids_and_one_only() -> None:
    tok = ByteTokenizer()
    assert parse_completion({"prompt": "hi"}, tok).prompt_ids == tok.encode("hi")
    assert parse_completion({"prompt": [[5, 6]]}, tok).prompt_ids == [5, 6]
    with pytest.raises(InvalidArgument, match=r"^prompt: "):
        parse_completion({"prompt": ["a", "b"]}, tok)
