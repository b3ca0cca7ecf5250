"""The OpenAI-compatible HTTP endpoint of an inference replica (`[inference.http]`).

`GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions` (streamed as SSE)
and vLLM's token-in/token-out `POST /inference/v1/generate`, each choice carrying the
`"tidal"` extension (token ids, policy versions). Handlers run on the service's loop with
gRPC's request checks; engine errors map to OpenAI-style bodies. A streamed request pulls
its first piece before the headers, so a refusal is an HTTP error. An API key is checked
before the body is read (sha256, constant time); beyond loopback key and TLS are required.
What aiohttp refuses before the key check costs a counter and at most a log line a minute
per kind (`server_log`); a body is parsed only within its byte and value bounds, and tool
schemas are checked in a worker process (`schema_checks`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from tidal.common.errors import (
    ConfigError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    TidalError,
    Unavailable,
)
from tidal.common.security.credentials import token_digest
from tidal.common.security.transport import TOKEN_PREFIX
from tidal.inference.config import OpenAIHttpConfig, RequestLimits
from tidal.inference.engine import Completion, Engine
from tidal.inference.openai.body import BadBody, read_object
from tidal.inference.openai.generate_protocol import generate_response, parse_generate
from tidal.inference.openai.protocol import (
    ParsedRequest,
    StopTrim,
    chat_logprobs,
    completion_logprobs,
    parse_chat,
    parse_completion,
    tidal_extension,
)
from tidal.inference.openai.reasoning import ChoiceReasoning
from tidal.inference.openai.schema_checks import SchemaChecks
from tidal.inference.openai.server_log import RateLimitedServerLog
from tidal.inference.openai.tools import tool_reply
from tidal.inference.request_checks import DEFAULT_LIMITS, check_against_model
from tidal.text.reasoning import ReasoningMode, ReasoningParser, reasoning_parser
from tidal.text.tokenizer import Tokenizer
from tidal.text.tool_calls import ParserName, tool_call_parser

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_STATUS = {InvalidArgument: 400, NotFound: 404, ResourceExhausted: 429, Unavailable: 503}
_TYPE = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def error_response(
    status: int, message: str, *, param: str | None, code: str | None
) -> web.Response:
    kind = _TYPE.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status)


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Domain errors and bad bodies → OpenAI-style error responses."""
    try:
        return await handler(request)
    except web.HTTPException as e:  # aiohttp's own 404/405 for unknown routes
        return error_response(e.status, e.reason, param=None, code=None)
    except BadBody as e:
        return error_response(e.status, str(e), param=None, code=e.code)
    except TidalError as e:
        status = next((s for cls, s in _STATUS.items() if isinstance(e, cls)), 500)
        field = e.field if isinstance(e, InvalidArgument) else None
        return error_response(status, str(e), param=field, code=type(e).__name__)
    except ConnectionError:  # the client went away mid-stream: nothing left to answer
        raise
    except Exception:  # a bug: an OpenAI-shaped 500 that tells the caller nothing inside
        log.exception("%s %s failed", request.method, request.path)
        return error_response(500, "internal error (logged by the server)", param=None, code=None)


def bearer_key(digest: str) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """Middleware: 401 unless `Authorization: Bearer <key>` hashes to `digest`."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        key = header[len(TOKEN_PREFIX) :].strip() if header.startswith(TOKEN_PREFIX) else ""
        # surrogateescape: aiohttp keeps a header's non-UTF-8 bytes as lone surrogates
        presented = hashlib.sha256(key.encode(errors="surrogateescape")).hexdigest()
        if key and hmac.compare_digest(digest, presented):
            return await handler(request)
        reply = error_response(
            401,
            "invalid API key" if key else "an API key is required (Authorization: Bearer <key>)",
            param=None,
            code="invalid_api_key",
        )
        reply.headers["WWW-Authenticate"] = "Bearer"
        return reply

    return check


def api_key_digest(path: Path) -> str:
    """The sha256 of the key in `path` (the key itself is not kept); ConfigError."""
    try:
        key = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"inference.http.api_key_file: cannot read {path} ({e})") from None
    if not key:
        raise ConfigError(f"inference.http.api_key_file: {path} is empty")
    return token_digest(key)


def server_tls(cert: Path, key: Path) -> ssl.SSLContext:
    """The HTTPS context of the inference role's certificate; ConfigError naming keys."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(
            f"inference.http.tls: cannot load {cert} / {key} ({e}); set security.tls_dir "
            "(or security.cert and security.key), or create them with `tidal certs --out DIR`"
        ) from None
    return context


class OpenAIEndpoint:
    """The aiohttp application over one engine and its tokenizer."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Tokenizer,
        *,
        model_name: str,
        limits: RequestLimits = DEFAULT_LIMITS,
        key_digest: str | None = None,
        max_body_bytes: int = OpenAIHttpConfig().max_body_bytes,
        max_body_values: int = OpenAIHttpConfig().max_body_values,
        tool_parser: ParserName = "auto",
        reasoning: ReasoningMode = "auto",
    ) -> None:
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.tool_parser = tool_call_parser(tokenizer, tool_parser)
        self.reasoning = reasoning_parser(tokenizer, reasoning)
        self.limits, self.max_body_bytes = limits, max_body_bytes
        self.max_body_values = max_body_values
        self.schemas = SchemaChecks()
        self.created = int(time.time())
        middlewares = [openai_errors] + ([] if key_digest is None else [bearer_key(key_digest)])
        self.app = web.Application(middlewares=middlewares, client_max_size=max_body_bytes)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_post("/v1/completions", self.completions)
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.router.add_post("/inference/v1/generate", self.generate)

    async def models(self, request: web.Request) -> web.Response:
        status = self.engine.status()
        card = {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "tidal",
            "max_model_len": status.max_seq_len,
            "tidal": {"policy_version": status.policy_version, "model": status.model},
        }
        return web.json_response({"object": "list", "data": [card]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def generate(self, request: web.Request) -> web.Response:
        """vLLM's token-in/token-out generate: the prompt's ids are served as sent."""
        body = await self._body(request, model_required=False)
        status = self.engine.status()
        parsed = parse_generate(
            body,
            eos_ids=self.tokenizer.eos_ids,
            max_seq_len=status.max_seq_len,
            limits=self.limits,
        )
        check_against_model(
            status,
            parsed.prompt_ids,
            parsed.params,
            prompt_field="token_ids",
            names=parsed.field_name,
        )
        pieces = self.engine.generate(parsed.prompt_ids, parsed.params, stream=False)
        async with contextlib.aclosing(pieces):  # type: ignore[type-var]
            done = [c async for c in pieces]
        request_id = parsed.request_id or f"gen-{uuid.uuid4().hex}"
        return web.json_response(generate_response(request_id, parsed, done))

    async def _body(self, request: web.Request, *, model_required: bool = True) -> dict[str, Any]:
        body = await read_object(request, self.max_body_bytes, self.max_body_values)
        model = body.get("model")
        if model is None and not model_required:
            return body
        if model != self.model_name:
            named = repr(model[:100]) if isinstance(model, str) else type(model).__name__
            raise NotFound(
                f"The model {named} does not exist; this replica serves {self.model_name!r}"
            )
        return body

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        body = await self._body(request)
        parsed = (parse_chat if chat else parse_completion)(body, self.tokenizer, self.limits)
        await self.schemas.check(parsed.tools.tools)
        check_against_model(
            self.engine.status(),
            parsed.prompt_ids,
            parsed.params,
            prompt_field=parsed.prompt_field,
            names=parsed.field_name,
        )
        pieces = self.engine.generate(parsed.prompt_ids, parsed.params, stream=parsed.stream)
        async with contextlib.aclosing(pieces):  # type: ignore[type-var]
            first = await anext(pieces, None)  # engine refusals surface before any header
            reply = _Reply(self, parsed, chat=chat)
            if not parsed.stream:
                return web.json_response(await reply.whole(first, pieces))
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await response.prepare(request)
            async for chunk in reply.chunks(first, pieces):
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response


class _Reply:
    """Builds one request's OpenAI response (whole) or its stream of chunks."""

    def __init__(self, endpoint: OpenAIEndpoint, parsed: ParsedRequest, *, chat: bool) -> None:
        self.tokenizer, self.parsed, self.chat = endpoint.tokenizer, parsed, chat
        kind = "chatcmpl" if chat else "cmpl"
        self.header = {
            "id": f"{kind}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": endpoint.model_name,
        }
        n = parsed.params.n
        self.trims = [StopTrim(parsed.params.stop) for _ in range(n)]
        parser = endpoint.reasoning if chat else ReasoningParser()  # completions: text only
        self.reasoning = ChoiceReasoning(parser, self.tokenizer, parsed.prompt_ids, n)
        self.text_len = [0] * n
        self.opened: set[int] = set()  # choices whose first chunk went out
        self.tool_streams = [parsed.tools.stream(endpoint.tool_parser) for _ in range(n)]
        self.generated = 0

    def _usage(self) -> dict[str, int]:
        prompt = len(self.parsed.prompt_ids)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": self.generated,
            "total_tokens": prompt + self.generated,
        }

    def _choice(self, c: Completion, *, stream: bool) -> dict[str, Any]:
        last = c.finish_reason is not None
        text = self.trims[c.index].push(c.text, last=last)
        choice: dict[str, Any] = {"index": c.index, "finish_reason": c.finish_reason}
        if self.chat:
            key = "delta" if stream else "message"
            # OpenAI names the role in a choice's first delta only; clients concatenate it
            first = not stream or c.index not in self.opened
            message = self.reasoning.message(c.index, text, last=last, stream=stream)
            choice[key] = {"role": "assistant", **message} if first else message
            self.opened.add(c.index)
            tools = self.tool_streams[c.index]
            if tools is not None:  # calls are read from the answer, never the reasoning
                answer = message["content"]
                choice[key].update(tool_reply(tools, answer, last=last, streamed=stream))
                if tools.calls and c.finish_reason == "stop":
                    choice["finish_reason"] = "tool_calls"
            choice["logprobs"] = (
                chat_logprobs(self.tokenizer, c) if self.parsed.want_logprobs else None
            )
        else:
            choice["text"] = text
            choice["logprobs"] = (
                completion_logprobs(self.tokenizer, c, self.text_len[c.index])
                if self.parsed.want_logprobs
                else None
            )
        self.text_len[c.index] += len(text)
        self.generated += len(c.token_ids)
        choice["tidal"] = tidal_extension(c)
        return choice

    async def whole(
        self, first: Completion | None, rest: AsyncIterator[Completion]
    ) -> dict[str, Any]:
        done = [] if first is None else [first]
        done += [c async for c in rest]
        choices = sorted((self._choice(c, stream=False) for c in done), key=lambda c: c["index"])
        return {**self.header, "choices": choices, "usage": self._usage()}

    async def chunks(
        self, first: Completion | None, rest: AsyncIterator[Completion]
    ) -> AsyncIterator[dict[str, Any]]:
        header = {
            **self.header,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
        }
        if first is not None:
            yield {**header, "choices": [self._choice(first, stream=True)]}
        async for c in rest:
            yield {**header, "choices": [self._choice(c, stream=True)]}
        if self.parsed.include_usage:
            yield {**header, "choices": [], "usage": self._usage()}


class OpenAIServer:
    """The endpoint's HTTP server: `start` binds (port 0 picks one), `close` stops it."""

    def __init__(
        self,
        endpoint: OpenAIEndpoint,
        config: OpenAIHttpConfig,
        *,
        tls: ssl.SSLContext | None = None,
        count_error: Callable[[str], None] | None = None,
    ) -> None:
        """`count_error(kind)` counts each error aiohttp handles itself (a metric)."""
        self.endpoint, self.config, self.tls = endpoint, config, tls
        # handler_cancellation: a client that disconnects cancels its handler, whose
        # `aclosing` then cancels the request in the engine (aiohttp's default lets it run).
        # auto_decompress off: a compressed body is refused unread (body.py), never
        # inflated past max_body_bytes nor failed inside aiohttp's parser.
        self._runner = web.AppRunner(
            endpoint.app,
            access_log=None,
            handler_cancellation=True,
            auto_decompress=False,
            logger=RateLimitedServerLog(count_error),
        )
        self.port = config.port

    @property
    def url(self) -> str:
        return self.config.url(self.port)

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port, ssl_context=self.tls)
        await site.start()
        self.port = int(self._runner.addresses[0][1])  # the bound port, when 0 asked for any

    async def close(self) -> None:
        await self._runner.cleanup()
        self.endpoint.schemas.close()
