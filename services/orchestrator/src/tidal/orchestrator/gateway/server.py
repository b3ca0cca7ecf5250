"""The session gateway: an OpenAI chat endpoint for agent programs, one key per episode.

Routes: `POST /v1/chat/completions`, `GET /v1/models` (and `/v1/models/{model}`),
`POST /v1/sessions/{id}/reward` and `POST /v1/sessions/{id}/loopback` (the sandbox
launcher's); nothing else. The key is checked before
any body is read: a key that is not an open episode's, or a session route of another
session, is 401. It listens on a Unix socket (the sandboxed launcher's way in, from any
network namespace) and, for agent services outside the sandbox, on a loopback TCP port.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from tidal.common.errors import InvalidArgument, ResourceExhausted, TidalError, Unavailable
from tidal.common.security.transport import TOKEN_PREFIX
from tidal.orchestrator.gateway.chat_reply import ChatReply, ChoiceReply
from tidal.orchestrator.gateway.chat_request import ChatCall, message_key, parse_chat_call
from tidal.orchestrator.gateway.keys import EpisodeKeys
from tidal.orchestrator.gateway.loopback import LoopbackError, peer_pid, raise_loopback
from tidal.orchestrator.gateway.session import AgentSession
from tidal.orchestrator.gateway.trace import RecordedTurn
from tidal.text.episode import EpisodeRenderError
from tidal.text.tokenizer import Tokenizer
from tidal.text.tool_calls import ParsedTurn, ToolCallParser

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SOCKET_NAME = "gateway.sock"
SESSION = web.RequestKey("session", AgentSession)
_STATUS = {InvalidArgument: 400, ResourceExhausted: 429, Unavailable: 503}


def error(status: int, message: str, *, param: str | None = None, code: str | None = None):  # type: ignore[no-untyped-def]
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status)


class BodyTooLarge(Exception):
    """A body over the gateway's bound (413), refused before or while reading it."""


class Gateway:
    """The endpoint over this run's tokenizer, tool-call parser and open sessions."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        parser: ToolCallParser,
        answer_of: Callable[[str], str],
        *,
        max_body_bytes: int,
        model_name: str = "tidal",
    ) -> None:
        self.tokenizer, self.parser, self.answer_of = tokenizer, parser, answer_of
        self.max_body_bytes, self.model_name = max_body_bytes, model_name
        self.keys: EpisodeKeys[AgentSession] = EpisodeKeys()
        self.app = web.Application(
            middlewares=[self._errors, self._authorize], client_max_size=max_body_bytes
        )
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_get("/v1/models/{model}", self.model)
        self.app.router.add_post("/v1/sessions/{id}/reward", self.reward)
        self.app.router.add_post("/v1/sessions/{id}/loopback", self.loopback)
        self.started = int(time.time())
        self._runner: web.AppRunner | None = None
        self._dir: Path | None = None
        self.socket_path: Path | None = None
        self.url = ""
        """The loopback TCP base URL (`http://127.0.0.1:PORT/v1`)."""

    async def start(self) -> None:
        # handler_cancellation: an agent that goes away mid-call cancels its generation
        self._runner = web.AppRunner(self.app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        self._dir = Path(tempfile.mkdtemp(prefix="tidal-gateway-"))
        os.chmod(self._dir, 0o711)  # sandbox uids may reach the socket, never list the dir
        self.socket_path = self._dir / SOCKET_NAME
        await web.UnixSite(self._runner, str(self.socket_path)).start()
        os.chmod(self.socket_path, 0o666)  # connecting needs write permission
        tcp = web.TCPSite(self._runner, "127.0.0.1", 0)
        await tcp.start()
        port = next(a[1] for a in self._runner.addresses if isinstance(a, tuple))
        self.url = f"http://127.0.0.1:{port}/v1"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def open(self, session: AgentSession, *, ttl_s: float) -> str:
        """Admit `session`; its key, valid for `ttl_s` seconds or until `close`."""
        return self.keys.mint(session, ttl_s=ttl_s)

    def close_session(self, key: str) -> None:
        self.keys.revoke(key)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except BodyTooLarge:
            limit = self.max_body_bytes
            return error(413, f"the body is larger than {limit} bytes", code="body_too_large")
        except web.HTTPException as e:
            return error(e.status, e.reason)
        except TidalError as e:
            status = next((s for cls, s in _STATUS.items() if isinstance(e, cls)), 500)
            field = e.field if isinstance(e, InvalidArgument) else None
            return error(status, str(e), param=field, code=type(e).__name__)
        except ConnectionError:
            raise
        except Exception:
            log.exception("gateway %s %s failed", request.method, request.path)
            return error(500, "internal error (logged by the orchestrator)")

    @web.middleware
    async def _authorize(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """401 unless the key is an open episode's and the route is that episode's; the
        body is not read before this."""
        header = request.headers.get("Authorization", "")
        key = header[len(TOKEN_PREFIX) :].strip() if header.startswith(TOKEN_PREFIX) else ""
        session = self.keys.session(key)
        named = request.match_info.get("id")
        if session is None or (named is not None and named != session.id):
            reply = error(
                401,
                "invalid API key" if key else "an API key is required (Authorization: Bearer)",
                code="invalid_api_key",
            )
            reply.headers["WWW-Authenticate"] = "Bearer"
            return reply
        request[SESSION] = session
        return await handler(request)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        """The JSON object sent, refused unread when larger than the bound."""
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            raise BodyTooLarge
        if request.headers.get("Content-Encoding", "identity").lower() not in ("", "identity"):
            raise InvalidArgument("Content-Encoding", "send the body uncompressed")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:  # no Content-Length: aiohttp stops at the bound
            raise BodyTooLarge from None
        try:  # strict JSON: no NaN or Infinity, nesting to a bound
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise InvalidArgument("body", "is not valid JSON") from None
        if not isinstance(body, dict):
            raise InvalidArgument("body", "must be a JSON object")
        return body

    async def chat(self, request: web.Request) -> web.StreamResponse:
        session = request[SESSION]
        call = parse_chat_call(await self._body(request))
        async with session.lock:
            reply = await self._turn(session, call)
        if not call.stream:
            return web.Response(body=orjson.dumps(reply.whole()), content_type="application/json")
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        for chunk in reply.chunks(include_usage=call.include_usage):
            await response.write(chunk)
        await response.write_eof()
        return response

    async def _turn(self, session: AgentSession, call: ChatCall) -> ChatReply:
        trace = session.trace
        if trace.calls + call.n > session.max_calls:
            raise ResourceExhausted(
                f"this episode made {trace.calls} of its {session.max_calls} model turns "
                f"and asked for {call.n} more"
            )
        try:
            pending = trace.prompt(call.messages, call.keys, call.tools)
        except (EpisodeRenderError, ValueError, TypeError) as exc:
            raise InvalidArgument("messages", f"cannot be rendered: {exc}") from None
        room = session.max_context - len(pending.ids)
        if room < 1:
            trace.undo(pending)
            session.context_full = True
            raise InvalidArgument(
                "messages", f"the prompt holds {len(pending.ids)} tokens; the model's "
                f"context is {session.max_context} (context_length_exceeded)",
            )  # fmt: skip
        max_tokens = min(session.max_tokens, call.max_tokens or session.max_tokens, room)
        try:
            turns = await session.generate(pending.ids, trace.calls, max_tokens, call.n)
        except asyncio.CancelledError:
            trace.undo(pending)
            raise
        except Exception as exc:  # the trace misses this turn: never trained half
            trace.undo(pending)
            session.failure = "inference_error"
            log.warning("gateway session %s: generation failed: %s", session.id, exc)
            raise Unavailable(f"generation failed: {exc}") from None
        choices, recorded = [], []
        for turn in turns:
            text = self.tokenizer.decode(turn.token_ids)
            answer = self.answer_of(text)
            parsed = self.parser.parse(answer, call.tools) if call.tools else ParsedTurn(answer)
            texts = None
            if call.logprobs:
                decode = self.tokenizer.decode
                texts = tuple(decode([t], skip_special=False) for t in turn.token_ids)
            choice = ChoiceReply(turn, parsed, texts)
            message = choice.message()
            choices.append((choice, message))
            key = message_key(choice.key_message(message))
            recorded.append(RecordedTurn(turn, text, parsed, key))
        trace.record(pending, recorded)
        return ChatReply(
            self.model_name,
            tuple(c for c, _ in choices),
            tuple(m for _, m in choices),
            len(pending.ids),
        )

    def _model_entry(self) -> dict[str, Any]:
        return {
            "id": self.model_name,
            "object": "model",
            "created": self.started,
            "owned_by": "tidal",
        }

    async def models(self, request: web.Request) -> web.Response:
        """The one model the gateway serves: the policy (any `model` a call names is it)."""
        return web.json_response({"object": "list", "data": [self._model_entry()]})

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name != self.model_name:
            return error(404, f"the gateway serves one model, {self.model_name!r}",
                         param="model", code="model_not_found")  # fmt: skip
        return web.json_response(self._model_entry())

    async def reward(self, request: web.Request) -> web.Response:
        session = request[SESSION]
        body = await self._body(request)
        value = body.get("reward")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidArgument("reward", "must be a number")
        if not math.isfinite(value):
            raise InvalidArgument("reward", "must be finite")
        if session.reward is not None:
            return error(409, "this episode's reward was already posted", code="conflict")
        session.reward = float(value)
        return web.json_response({"session_id": session.id, "reward": session.reward})

    async def loopback(self, request: web.Request) -> web.Response:
        sock = request.transport.get_extra_info("socket") if request.transport else None
        if sock is None or sock.family != socket.AF_UNIX:
            raise InvalidArgument("transport", "loopback is asked for over the gateway's socket")
        try:
            await asyncio.to_thread(raise_loopback, peer_pid(sock))
        except LoopbackError as exc:
            raise Unavailable(f"cannot bring up the sandbox's loopback: {exc}") from None
        return web.Response(status=204)
