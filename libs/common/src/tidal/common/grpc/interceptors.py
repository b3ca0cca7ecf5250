"""Server and client interceptors: domain errors to status codes, request ids, limits.

`ErrorMappingInterceptor` is the one place exceptions become statuses: a `TidalError` keeps
its code and message (its class in trailing metadata); anything else is answered `internal
error <id>` with the traceback logged under the id, so a bug neither stops the server nor
shows the caller its text. It also holds the concurrency limit of
`tidal.common.grpc.limits`, and serves each single-request method as a client stream of
one message read only inside the handler: what runs before (authorization, the
concurrency limit) then costs the caller's body nothing. Tracing is opentelemetry's.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from tidal.common.config.shared import GrpcConfig
from tidal.common.errors import InvalidArgument, TidalError
from tidal.common.grpc.limits import RpcSlots, counted
from tidal.common.observability.logging import request_id_var

log = logging.getLogger(__name__)

REQUEST_ID_KEY = "x-request-id"
ERROR_KIND_KEY = "tidal-error"
"""Trailing metadata naming a domain error's class (`DiskFull`), for callers whose answer
depends on more than the status code."""


def reported_kind(error: grpc.aio.AioRpcError) -> str | None:
    """The domain error class a failed call's server named (`ERROR_KIND_KEY`), if any."""
    kinds = [v for k, v in error.trailing_metadata() or () if k == ERROR_KIND_KEY]
    return str(kinds[0]) if kinds else None


def _request_id(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == REQUEST_ID_KEY:
            return str(value)
    return uuid.uuid4().hex[:12]


async def _abort_for(exc: Exception, context: grpc.aio.ServicerContext, method: str) -> None:
    if isinstance(exc, TidalError):
        log.info("%s failed: %s %s", method, exc.code.name, exc)
        kind = ((ERROR_KIND_KEY, type(exc).__name__),)
        await context.abort(exc.code, str(exc), trailing_metadata=kind)
    error_id = uuid.uuid4().hex[:12]
    log.exception("%s crashed (error id %s)", method, error_id)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error {error_id}")


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, config: GrpcConfig | None = None) -> None:
        self.config = config
        self.slots = RpcSlots(config.max_concurrent_rpcs) if config is not None else None

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        full_method = handler_call_details.method
        method = full_method.rsplit("/", 1)[-1]
        # Probes keep their shapes: they are open, so nothing runs before their read.
        read_one = counted(full_method)
        slots = self.slots if read_one else None
        options: dict[str, Any] = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            # On the wire a unary request is one message then half-close, as a client
            # stream of one is: the handler starts before the body is received, and
            # HTTP/2 flow control keeps the unread body with the caller.
            make = (
                grpc.stream_unary_rpc_method_handler
                if read_one
                else grpc.unary_unary_rpc_method_handler
            )
            return make(_wrap_unary(handler.unary_unary, method, slots, read_one), **options)
        if handler.unary_stream is not None:
            # A server-streaming handler either yields its responses (async generator) or
            # is a coroutine that writes them with `context.write` (grpc_health's Watch).
            stream = handler.unary_stream
            wrap = _wrap_stream if inspect.isasyncgenfunction(stream) else _wrap_unary
            make = (
                grpc.stream_stream_rpc_method_handler
                if read_one
                else grpc.unary_stream_rpc_method_handler
            )
            return make(wrap(stream, method, slots, read_one), **options)
        if handler.stream_unary is not None:  # client streaming (weight uploads)
            return grpc.stream_unary_rpc_method_handler(
                _wrap_unary(handler.stream_unary, method, slots), **options
            )
        return handler  # bidi streaming: none in the v1 contracts


@contextlib.asynccontextmanager
async def _mapped_errors(
    context: grpc.aio.ServicerContext, method: str, slots: RpcSlots | None
) -> AsyncIterator[None]:
    """Bind the request id for the call's logs; hold a slot of the concurrency limit;
    turn an escaping exception into a status."""
    token = request_id_var.set(_request_id(context))
    held = False
    try:
        if slots is not None:
            slots.acquire()
            held = True
        yield
    except (grpc.aio.AbortError, grpc.aio.UsageError):
        raise
    except Exception as exc:
        await _abort_for(exc, context, method)
    finally:
        if held:
            slots.release()  # type: ignore[union-attr]
        request_id_var.reset(token)


async def _request(request: Any, read_one: bool) -> Any:
    """The handler's request: for a single-request method, its one message, read now."""
    if not read_one:
        return request
    async for message in request:
        return message
    raise InvalidArgument("request", "the call carried no request message")


def _wrap_unary(
    behaviour: Callable[..., Any],
    method: str,
    slots: RpcSlots | None = None,
    read_one: bool = False,
) -> Callable[..., Any]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with _mapped_errors(context, method, slots):
            return await behaviour(await _request(request, read_one), context)

    return wrapped


def _wrap_stream(
    behaviour: Callable[..., Any],
    method: str,
    slots: RpcSlots | None = None,
    read_one: bool = False,
) -> Callable[..., Any]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async with _mapped_errors(context, method, slots):
            async for response in behaviour(await _request(request, read_one), context):
                yield response

    return wrapped


class RequestIdClientInterceptor(
    grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor
):
    """Forwards the current request id (if any) so logs of one call chain correlate."""

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        rid = request_id_var.get()
        if rid == "-":
            return details
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(REQUEST_ID_KEY, rid)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    async def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(client_call_details), request)

    async def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(client_call_details), request)
