"""Requests that cannot be decoded: refused as bad input, after the caller's token, never a traceback.

gRPC decodes a request before the servicer runs, and a message that is not valid protobuf wire
format for the method's request type makes grpcio answer UNKNOWN with the decoder's exception in
the status text (and log a traceback). `UndecodableRequestInterceptor` (installed by every service's
`ServiceHost`) decodes requests itself: an undecodable one reaches no servicer; the call is answered
UNAUTHENTICATED when it carries no valid token (so a caller without one learns nothing about the
method), else INVALID_ARGUMENT naming `request`. Streams are refused at their first undecodable
message. Logged in one line, without a traceback.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from services.shared.auth import TokenAuthority
from services.shared.errors import BossError, FieldViolation, InvalidArgument, grpc_status_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Undecodable:
    """What the interceptor's decoder hands on for bytes that are not a request message."""

    problem: str


def _decoder(decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def safe(data: bytes) -> Any:
        try:
            return decode(data)
        except Exception as error:  # DecodeError, or anything a decoder raises on bad bytes
            return Undecodable(type(error).__name__)

    return safe


class UndecodableRequestInterceptor(grpc.aio.ServerInterceptor):
    """Refuses undecodable requests (module docstring).

    Args:
        authority: verifies the caller's token first; None answers INVALID_ARGUMENT at once.
    """

    def __init__(self, authority: TokenAuthority | None = None) -> None:
        self._authority = authority

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = str(handler_call_details.method)  # type: ignore[attr-defined]
        decode = _decoder(handler.request_deserializer)
        serialize = handler.response_serializer
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, method), decode, serialize
            )
        if handler.unary_stream is not None and inspect.isasyncgenfunction(handler.unary_stream):
            return grpc.unary_stream_rpc_method_handler(
                self._unary_stream(handler.unary_stream, method), decode, serialize
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._stream_unary(handler.stream_unary, method), decode, serialize
            )
        if handler.stream_stream is not None and inspect.isasyncgenfunction(handler.stream_stream):
            return grpc.stream_stream_rpc_method_handler(
                self._stream_stream(handler.stream_stream, method), decode, serialize
            )
        return handler

    async def _refuse(self, context: grpc.aio.ServicerContext, method: str, problem: Undecodable) -> None:
        """Aborts the call: UNAUTHENTICATED without a valid token, else INVALID_ARGUMENT."""
        error: BossError = InvalidArgument(
            [FieldViolation("request", f"is not a valid {method} request message (protobuf wire format)")]
        )
        if self._authority is not None:
            try:
                self._authority.verify_grpc(context)
            except BossError as refused:
                error = refused
        log.warning("undecodable request to %s (%s) refused: %s", method, problem.problem, error.code.name)
        await context.abort_with_status(grpc_status_of(error))

    def _unary(self, behavior: Any, method: str) -> Any:
        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Undecodable):
                await self._refuse(context, method, request)
            return await behavior(request, context)

        return unary

    def _unary_stream(self, behavior: Any, method: str) -> Any:
        async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                await self._refuse(context, method, request)
            async for response in behavior(request, context):
                yield response

        return unary_stream

    def _checked(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext, method: str
    ) -> AsyncIterator[Any]:
        async def checked() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, Undecodable):
                    await self._refuse(context, method, request)
                yield request

        return checked()

    def _stream_unary(self, behavior: Any, method: str) -> Any:
        async def stream_unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            return await behavior(self._checked(requests, context, method), context)

        return stream_unary

    def _stream_stream(self, behavior: Any, method: str) -> Any:
        async def stream_stream(
            requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            async for response in behavior(self._checked(requests, context, method), context):
                yield response

        return stream_stream
