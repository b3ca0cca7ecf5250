"""Server and client interceptors: errors → status codes, request ids.

`ErrorMappingInterceptor` is the one place domain exceptions become gRPC statuses:
a `TidalError` aborts with its own code and message; any other exception is logged with
its traceback and answered INTERNAL, so a bug in one request never takes the server down
and never returns an error string inside a successful response. It also binds the
request id (`x-request-id` metadata, or a fresh one) to the logging context.

Tracing is not done here: opentelemetry-instrumentation-grpc's interceptors handle it.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from tidal.common.errors import TidalError
from tidal.common.logging import request_id_var

log = logging.getLogger(__name__)

REQUEST_ID_KEY = "x-request-id"


def _request_id(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == REQUEST_ID_KEY:
            return str(value)
    return uuid.uuid4().hex[:12]


async def _abort_for(exc: Exception, context: grpc.aio.ServicerContext, method: str) -> None:
    if isinstance(exc, TidalError):
        log.info("%s failed: %s %s", method, exc.code.name, exc)
        await context.abort(exc.code, str(exc))
    log.exception("%s crashed", method)
    await context.abort(grpc.StatusCode.INTERNAL, f"{method}: {type(exc).__name__}: {exc}")


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            # A server-streaming handler either yields its responses (async generator) or
            # is a coroutine that writes them with `context.write` (grpc_health's Watch).
            stream = handler.unary_stream
            wrap = _wrap_stream if inspect.isasyncgenfunction(stream) else _wrap_unary
            return grpc.unary_stream_rpc_method_handler(
                wrap(stream, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary is not None:  # client streaming (weight uploads)
            return grpc.stream_unary_rpc_method_handler(
                _wrap_unary(handler.stream_unary, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler  # bidi streaming: none in the v1 contracts


@contextlib.asynccontextmanager
async def _mapped_errors(context: grpc.aio.ServicerContext, method: str) -> AsyncIterator[None]:
    """Bind the request id for the call's logs; turn an escaping exception into a status."""
    token = request_id_var.set(_request_id(context))
    try:
        yield
    except (grpc.aio.AbortError, grpc.aio.UsageError):
        raise
    except Exception as exc:
        await _abort_for(exc, context, method)
    finally:
        request_id_var.reset(token)


def _wrap_unary(behaviour: Callable[..., Any], method: str) -> Callable[..., Any]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with _mapped_errors(context, method):
            return await behaviour(request, context)

    return wrapped


def _wrap_stream(behaviour: Callable[..., Any], method: str) -> Callable[..., Any]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async with _mapped_errors(context, method):
            async for response in behaviour(request, context):
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
