"""OpenAI bodies → domain requests, and the endpoint's config (no server, no model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tidal.common.errors import ConfigError, InvalidArgument
from tidal.common.security.config import SecurityConfig
from tidal.inference.config import InferenceConfig, InferenceRunConfig, OpenAIHttpConfig
from tidal.inference.main import openai_http_credentials
from tidal.inference.openai.body import BadBody, check_value_count, decode_text, parse_object
from tidal.inference.openai.protocol import (
    StopTrim,
    parse_chat,
    parse_completion,
    sampling_from_body,
)
from tidal.text.byte import ByteTokenizer


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "10.1.2.3", "example.com", "127.attacker.example", "127.0.0.1.nip.io"]
)
def test_a_non_loopback_http_host_is_a_config_error(host: str) -> None:
    with pytest.raises(ValidationError, match="not a loopback address: the OpenAI endpoint"):
        InferenceConfig.model_validate({"http": {"enabled": True, "host": host}})


@pytest.mark.parametrize("host", ["127.0.0.1", "127.9.8.7", "::1", "localhost"])
def test_loopback_addresses_and_localhost_resolved_to_loopback_are_accepted(host: str) -> None:
    assert OpenAIHttpConfig(enabled=True, host=host).host == host


@pytest.mark.parametrize(
    ("secured", "missing"),
    [
        ({}, "set inference.http.api_key_file and inference.http.tls"),
        ({"tls": True}, "set inference.http.api_key_file, or"),
        ({"api_key_file": "k"}, "set inference.http.tls, or"),
    ],
)
def test_beyond_loopback_needs_both_an_api_key_and_tls(
    secured: dict[str, object], missing: str
) -> None:
    with pytest.raises(ValidationError, match=missing):
        OpenAIHttpConfig(enabled=True, host="0.0.0.0", **secured)
    both = OpenAIHttpConfig(enabled=True, host="0.0.0.0", api_key_file=Path("k"), tls=True)
    assert both.url(8000) == "https://0.0.0.0:8000/v1"


def test_an_unreadable_key_or_missing_certificate_is_a_config_error_naming_the_key(
    tmp_path: Path,
) -> None:
    config = InferenceRunConfig(
        run={"output_dir": tmp_path},
        security=SecurityConfig(mode="plaintext"),
        inference={"http": {"enabled": True, "api_key_file": tmp_path / "none.key"}},
    )
    with pytest.raises(ConfigError, match=r"^inference.http.api_key_file: cannot read"):
        openai_http_credentials(config)
    (tmp_path / "empty.key").write_text("\n")
    config.inference.http.api_key_file = tmp_path / "empty.key"
    with pytest.raises(ConfigError, match=r"^inference.http.api_key_file: .* is empty"):
        openai_http_credentials(config)
    (tmp_path / "ok.key").write_text("sk-1\n")
    config.inference.http.api_key_file = tmp_path / "ok.key"
    config.inference.http.tls = True
    with pytest.raises(ConfigError, match=r"^inference.http.tls: cannot load .*inference.pem"):
        openai_http_credentials(config)


@pytest.mark.parametrize(
    ("raw", "charset", "status", "says"),
    [
        (b"[" * 100_000 + b"]" * 100_000, None, 400, "nested too deeply"),
        (b"{}", "x-no-such", 415, "'x-no-such' is not supported"),
        (b"{}", "zlib", 415, "send JSON as UTF-8"),
        (b'{"a": "\xff"}', "utf-8", 400, "not valid utf-8"),
        (b'{"a": "\\ud800"}', None, 400, "lone surrogate"),
        (b'{"a": NaN}', None, 400, "NaN is not a JSON value"),
        (b'{"a": 1' + b"0" * 5000 + b"}", None, 400, "not valid JSON"),
        (b"[1]", None, 400, "must be a JSON object"),
    ],
)
def test_malformed_bodies_are_refused_with_a_4xx_saying_why(
    raw: bytes, charset: str | None, status: int, says: str
) -> None:
    with pytest.raises(BadBody, match=says) as refused:
        parse_object(decode_text(raw, charset))
    assert refused.value.status == status


def test_a_surrogate_pair_and_an_escaped_backslash_are_valid_text() -> None:
    body = parse_object(decode_text(b'{"a": "\\ud83d\\ude00", "b": "\\\\ud800"}', "UTF8"))
    assert body == {"a": "\U0001f600", "b": "\\ud800"}


def test_a_number_no_float_holds_and_a_text_part_without_text_are_refused() -> None:
    tok = ByteTokenizer()
    with pytest.raises(InvalidArgument, match=r"^temperature: is out of range"):
        sampling_from_body({"temperature": 10**400}, eos_ids=())
    with pytest.raises(InvalidArgument, match=r"^messages\[0\].content: only text parts"):
        parse_chat({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, tok)


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


@pytest.mark.parametrize(
    "field",
    [
        {"guided_json": {"type": "object"}},
        {"guided_json": {}},  # any schema still asks for JSON
        {"guided_regex": "a+"},
        {"guided_choice": ["yes", "no"]},
        {"structured_outputs": {"json": {}}},
        {"use_beam_search": True},
        {"length_penalty": 0.5},
        {"min_tokens": 3},
        {"bad_words": ["x"]},
        {"allowed_token_ids": [1, 2]},
        {"prompt_logprobs": 0},
    ],
)
def test_vllm_extensions_that_change_the_result_are_refused_not_ignored(
    field: dict[str, Any],
) -> None:
    [name] = field
    with pytest.raises(InvalidArgument, match=rf"^{name}: not supported"):
        sampling_from_body(field, eos_ids=())


def test_their_neutral_values_are_served() -> None:
    neutral = {"use_beam_search": False, "length_penalty": 1.0, "min_tokens": 0}
    assert sampling_from_body({**neutral, "guided_json": None}, eos_ids=()).n == 1


def test_top_k_minus_one_is_vllms_off_and_other_negatives_are_refused() -> None:
    assert sampling_from_body({"top_k": -1}, eos_ids=()).top_k == 0
    with pytest.raises(InvalidArgument, match=r"^top_k: must be in \[0, .*got -5$"):
        sampling_from_body({"top_k": -5}, eos_ids=())


def test_a_body_with_more_values_than_the_limit_is_refused_before_parsing() -> None:
    check_value_count(b'{"prompt": [1, 2, 3]}', 4)
    with pytest.raises(BadBody, match=r"inference\.http\.max_body_values") as refused:
        check_value_count(b'{"prompt": [1, 2, 3, 4]}', 4)
    assert refused.value.status == 413


def test_eos_ends_a_completion_unless_ignore_eos() -> None:
    assert sampling_from_body({}, eos_ids=(7,)).stop_token_ids == (7,)
    assert sampling_from_body({"ignore_eos": True}, eos_ids=(7,)).stop_token_ids == ()


def test_a_prompt_is_text_or_ids_and_one_only() -> None:
    tok = ByteTokenizer()
    assert parse_completion({"prompt": "hi"}, tok).prompt_ids == tok.encode("hi")
    assert parse_completion({"prompt": [[5, 6]]}, tok).prompt_ids == [5, 6]
    with pytest.raises(InvalidArgument, match=r"^prompt: "):
        parse_completion({"prompt": ["a", "b"]}, tok)
