"""`/mcp`: the MCP tools (worker.interfaces.mcp_server) over streamable HTTP, behind the API's
bearer tokens: a request without a valid token is a 401 before MCP sees it, and every tool acts as
the token's tenant (I5).

Stateless: each request stands alone, so any API replica can answer any request without session
affinity. DNS-rebinding protection is off because it guards unauthenticated local servers from web
pages, and a page cannot attach a bearer token it does not know.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from mcp.server.mcpserver import Context
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from worker.interfaces.mcp_server import create_mcp_server
from worker.producer import Producer

from .deps import TOKEN_REQUIRED, Caller, caller_for

PATH = "/mcp"
CALLER_STATE = "grounded_caller"


class BearerGuard:
    """Authenticates before the MCP transport reads anything, and leaves the caller in the request's
    state, where the transport's Request (and so the tool's context) finds it."""

    def __init__(self, app: ASGIApp, tokens: dict[str, str]) -> None:
        self.app, self.tokens = app, tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        caller = caller_for(self.tokens, token.strip()) if scheme.lower() == "bearer" and token.strip() else None
        if caller is None:
            response = JSONResponse({"detail": TOKEN_REQUIRED}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})[CALLER_STATE] = caller
        await self.app(scope, receive, send)


def request_tenant(ctx: Context) -> str:
    request: Any = ctx.request_context.request
    caller = getattr(request.state, CALLER_STATE, None) if request is not None else None
    assert isinstance(caller, Caller), "every /mcp request passes BearerGuard"
    return caller.tenant


def mount_mcp(api: FastAPI, producer: Producer, *, tokens: dict[str, str], max_request_bytes: int,
              ) -> contextlib.AbstractAsyncContextManager[None]:
    """Adds the route; returns the lifespan the app must run (the transport's task group)."""
    server = create_mcp_server(producer, request_tenant)
    server.streamable_http_app(
        streamable_http_path=PATH, stateless_http=True, max_request_body_size=max_request_bytes,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    endpoint = BearerGuard(StreamableHTTPASGIApp(server.session_manager), tokens)
    api.router.routes.append(Route(PATH, endpoint=endpoint, methods=["GET", "POST", "DELETE"], include_in_schema=False))

    @contextlib.asynccontextmanager
    async def lifespan() -> AsyncIterator[None]:
        async with server.session_manager.run():
            yield

    return lifespan()
