"""A request body of the OpenAI endpoint → one JSON object, or a 4xx saying what is wrong.

Every way a body can be malformed is refused here, before any field is read: too large
(413, by Content-Length before reading when it is sent), holding more JSON values than
parsing should cost the event loop (413, counted on the raw bytes), compressed or in a charset
other than UTF-8 (415), cut short, not UTF-8, not strict JSON (NaN and Infinity are
not), nested deeper than the decoder recurses, integers beyond Python's digit limit,
strings with lone surrogate escapes, a top level that is not an object (400). So the
parameter parsing after it only meets values JSON and Python's text handling agree on.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import Any, NoReturn

from aiohttp import web

_UTF8 = ("utf-8", "ascii")  # codec names after codecs.lookup; ASCII is a subset of UTF-8
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class BadBody(Exception):
    """A body refused before parsing its parameters: an HTTP status and a message."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def _not_json(constant: str) -> NoReturn:
    raise ValueError(f"{constant} is not a JSON value")


def decode_text(raw: bytes, charset: str | None) -> str:
    """The body's text: UTF-8 (or ASCII) only, as RFC 8259 asks of JSON on the wire."""
    name = "utf-8"
    if charset is not None:
        try:
            name = codecs.lookup(charset).name
        except (LookupError, ValueError):
            name = ""
        if name not in _UTF8:
            raise BadBody(
                415,
                f"charset {charset[:64]!r} is not supported: send JSON as UTF-8",
                "unsupported_charset",
            ) from None
    try:
        return raw.decode(name)
    except UnicodeDecodeError as e:
        raise BadBody(
            400, f"the body is not valid {name} (at byte {e.start})", "invalid_body"
        ) from None


def parse_object(text: str) -> dict[str, Any]:
    """The JSON object `text` holds; BadBody (400) for anything else."""
    try:
        body = json.loads(text, parse_constant=_not_json)
    except RecursionError:
        raise BadBody(
            400, "the body is not valid JSON: nested too deeply", "invalid_json"
        ) from None
    except ValueError as e:  # JSONDecodeError, NaN/Infinity, an integer over the digit limit
        raise BadBody(400, f"the body is not valid JSON: {str(e)[:200]}", "invalid_json") from None
    if not isinstance(body, dict):
        raise BadBody(400, "the body must be a JSON object", "invalid_json")
    if _SURROGATE_ESCAPE.search(text) is not None:
        try:  # a pair is fine; a lone half cannot become UTF-8 (a prompt, a stop string)
            json.dumps(body, ensure_ascii=False).encode()
        except (UnicodeEncodeError, RecursionError):
            raise BadBody(
                400,
                "the body holds a string with a lone surrogate escape (\\ud800-\\udfff)",
                "invalid_json",
            ) from None
    return body


def check_value_count(raw: bytes, max_values: int) -> None:
    """Refuse a body that may hold more than `max_values` JSON values, before parsing it.
    Every value but the first follows a `,` or opens a container, so the count of those
    bytes bounds the values from above at the cost of a memchr."""
    count = raw.count(b",") + raw.count(b"{") + raw.count(b"[")
    if count > max_values:
        raise BadBody(
            413,
            f"the body holds up to {count} JSON values (its `,`, `{{` and `[` bytes), more than "
            f"{max_values} (inference.http.max_body_values)",
            "body_too_large",
        )


async def read_object(request: web.Request, max_bytes: int, max_values: int) -> dict[str, Any]:
    """The request's JSON object, read only when its size is within `max_bytes` and parsed
    only when it holds at most `max_values` values."""
    too_large = BadBody(
        413,
        f"the body is larger than {max_bytes} bytes (inference.http.max_body_bytes)",
        "body_too_large",
    )
    if request.content_length is not None and request.content_length > max_bytes:
        raise too_large
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise BadBody(
            415,
            f"Content-Encoding {encoding[:64]!r} is not supported: send the body uncompressed",
            "unsupported_encoding",
        )
    try:
        raw = await request.read()  # aiohttp stops reading past the app's client_max_size
    except web.HTTPRequestEntityTooLarge:
        raise too_large from None
    except web.RequestPayloadError as e:  # the connection ended or framing broke mid-body
        raise BadBody(400, f"the body could not be read ({e})", "invalid_body") from None
    check_value_count(raw, max_values)
    return parse_object(decode_text(raw, request.charset))
