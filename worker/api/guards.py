"""The API's edges, whatever the route: a body over the size limit is refused before it is read
whole (413), and a Redis that is down is a 503 a client may retry, never a crash (500).

Submissions are read into memory and validated whole (jobs.parse_batch), so without a byte limit
one request could exhaust the API's memory; the line limit (GROUNDED_MAX_BATCH_LINES) is checked
by parse_batch and reported as a 422 like any other line problem.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from worker.store.outages import REDIS_UNAVAILABLE, unavailable

RETRY_AFTER_S = 5


class BodyTooLarge(Exception):
    pass


def too_large(limit: int) -> JSONResponse:
    return JSONResponse({"detail": [{"line": 0, "problem": f"the request body is larger than {limit} bytes "
                                                         "(GROUNDED_MAX_REQUEST_BYTES); split the batch"}]},
                        status_code=413)


class BodyLimit:
    """Refuses a declared Content-Length over the limit at once, and stops reading a body (chunked or
    lying about its length) as soon as it passes the limit."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await JSONResponse({"detail": "invalid Content-Length"}, status_code=400)(scope, receive, send)
                return
            if length > self.max_bytes:
                await too_large(self.max_bytes)(scope, receive, send)
                return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge()
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if started:
                raise
            await too_large(self.max_bytes)(scope, receive, send)


async def redis_unavailable(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(
        {"detail": unavailable(exc)},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def install_guards(api: FastAPI, *, max_request_bytes: int) -> None:
    api.add_middleware(BodyLimit, max_bytes=max_request_bytes)
    for error in REDIS_UNAVAILABLE:
        api.add_exception_handler(error, redis_unavailable)

