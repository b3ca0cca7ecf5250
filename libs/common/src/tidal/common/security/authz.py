"""Per-method authorization by role: which identity may call which RPC.

One table (`POLICY`) maps every method to the roles that call it; a method missing from it
is denied (fail closed). The role comes from the verified peer certificate (mTLS) or the
bearer token. grpc.aio server interceptors see no peer identity, so the check wraps each
method's handler; `tidal.common.grpc.interceptors` serves every Tidal request as a stream,
so that handler starts, and refuses, before the request body is received
(docs/operations.md, "Security model" and "Limits").
"""

from __future__ import annotations

import hmac
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc

from tidal.common.security.credentials import (
    ROLE_URI_PREFIX,
    ROLES,
    role_of_certificate,
    token_digest,
)
from tidal.common.security.transport import TOKEN_PREFIX, TransportSecurity

log = logging.getLogger(__name__)

ANY_ROLE = frozenset(ROLES)
_INF, _ORCH, _TRAIN = (
    "/tidal.rpc.v1.InferenceService/",
    "/tidal.rpc.v1.OrchestratorService/",
    ("/tidal.rpc.v1.TrainerService/"),
)
_WS = "/tidal.rpc.v1.WeightSyncService/"

POLICY: Mapping[str, frozenset[str]] = {
    _INF + "Generate": frozenset({"orchestrator", "operator"}),
    _INF + "Score": frozenset({"orchestrator", "operator"}),
    _INF + "GetStatus": ANY_ROLE,
    # A stream held open for as long as the caller likes: the orchestrator routes and
    # admits by it; an operator may watch.
    _INF + "WatchOccupancy": frozenset({"orchestrator", "operator"}),
    _ORCH + "GetProgress": ANY_ROLE,
    _TRAIN + "Train": frozenset({"orchestrator"}),
    _TRAIN + "TrainStream": frozenset({"orchestrator"}),
    _TRAIN + "GetStatus": ANY_ROLE,
    # Writes of versions: only the trainer publishes (Publish for the shared filesystem,
    # UploadWeights + GetUploadProgress for the stream path).
    _WS + "Publish": frozenset({"trainer"}),
    _WS + "UploadWeights": frozenset({"trainer"}),
    _WS + "GetUploadProgress": frozenset({"trainer"}),
    # The data-path rendezvous: the trainer (source) and replicas (receivers).
    _WS + "JoinSync": frozenset({"trainer", "inference"}),
    # Replica bookkeeping pins versions on disk: replicas only (Watch registers its
    # caller as a replica). The orchestrator follows loaded versions with WatchLoaded.
    _WS + "BeginLoad": frozenset({"inference"}),
    _WS + "AckLoaded": frozenset({"inference"}),
    _WS + "FetchWeights": frozenset({"inference"}),
    _WS + "Watch": frozenset({"inference"}),
    _WS + "WatchLoaded": frozenset({"orchestrator"}),
    _WS + "GetVersion": ANY_ROLE,
    _WS + "ListVersions": ANY_ROLE,
}
OPEN = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})
REFLECTION = frozenset(
    {
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    }
)


class Denied(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


def allowed_roles(method: str, *, reflection: bool) -> frozenset[str] | None:
    """Roles that may call `method`; None means open to any caller."""
    if method in OPEN:
        return None
    if method in REFLECTION:
        return ANY_ROLE if reflection else frozenset()
    return POLICY.get(method, frozenset())


class Authorizer:
    """Finds the caller's role and decides; one per server."""

    def __init__(self, security: TransportSecurity):
        self.security = security
        self._cert_roles: dict[bytes, str | None] = {}

    def role(self, context: grpc.aio.ServicerContext, method: str) -> str:
        if self.security.mode == "token":
            return self._token_role(context, method)
        auth = context.auth_context()
        for uri in auth.get("x509_uri_subject_alternative_name", ()):
            text = uri.decode() if isinstance(uri, bytes) else str(uri)
            if text.startswith(ROLE_URI_PREFIX):
                return text[len(ROLE_URI_PREFIX) :]
        for pem in auth.get("x509_pem_cert", ()):  # older gRPC: parse the verified cert
            if pem not in self._cert_roles:
                self._cert_roles[pem] = role_of_certificate(pem)
            found = self._cert_roles[pem]
            if found is not None:
                return found
        raise Denied(
            grpc.StatusCode.UNAUTHENTICATED,
            f"{method}: the caller presented no certificate carrying a Tidal role "
            f"({ROLE_URI_PREFIX}<role>)",
        )

    def _token_role(self, context: grpc.aio.ServicerContext, method: str) -> str:
        header = ""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                header = value if isinstance(value, str) else value.decode()
        if not header.startswith(TOKEN_PREFIX):
            raise Denied(grpc.StatusCode.UNAUTHENTICATED, f"{method}: no bearer token")
        token = header[len(TOKEN_PREFIX) :].strip()
        claimed = token.split(".", 1)[0]
        expected = self.security.verifiers.get(claimed)
        if expected is None or not hmac.compare_digest(expected, token_digest(token)):
            raise Denied(grpc.StatusCode.UNAUTHENTICATED, f"{method}: invalid token")
        return claimed

    def check(self, context: grpc.aio.ServicerContext, method: str) -> None:
        roles = allowed_roles(method, reflection=self.security.reflection)
        if roles is None:
            return
        role = self.role(context, method)
        if role not in roles:
            allowed = ", ".join(sorted(roles)) or "nobody (not enabled)"
            raise Denied(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{method}: role {role!r} may not call this method (allowed: {allowed})",
            )


class AuthorizationInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, security: TransportSecurity):
        self.authorizer = Authorizer(security)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        kinds = (
            ("unary_unary", grpc.unary_unary_rpc_method_handler),
            ("unary_stream", grpc.unary_stream_rpc_method_handler),
            ("stream_unary", grpc.stream_unary_rpc_method_handler),
            ("stream_stream", grpc.stream_stream_rpc_method_handler),
        )
        for attr, make in kinds:
            behaviour = getattr(handler, attr)
            if behaviour is not None:
                return make(
                    self._guard(behaviour, method),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler

    def _guard(self, behaviour: Callable[..., Any], method: str) -> Callable[..., Any]:
        authorizer = self.authorizer

        async def deny_or_pass(context: grpc.aio.ServicerContext) -> None:
            try:
                authorizer.check(context, method)
            except Denied as denied:
                log.warning("denied: %s", denied)
                await context.abort(denied.code, str(denied))

        if inspect.isasyncgenfunction(behaviour):

            async def streamed(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await deny_or_pass(context)
                async for response in behaviour(request, context):
                    yield response

            return streamed

        async def called(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await deny_or_pass(context)
            result = behaviour(request, context)
            if inspect.isasyncgen(result):  # a wrapped generator: drain by writes
                async for response in result:
                    await context.write(response)
                return None
            return await result if inspect.isawaitable(result) else result

        return called
