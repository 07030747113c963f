"""The producer HTTP API (FastAPI): `create_api` only assembles; each resource is a router module."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
from fastapi import Depends, FastAPI
from fastapi_offline import FastAPIOffline

from worker.interfaces.openai_batch import OpenAIBatches
from worker.interfaces.openai_format import OpenAIRequestError
from worker.jobs.served import BrokenConfig
from worker.producer import Producer
from worker.settings import Settings, get_settings

from . import batches, conversations, health, jobs, mcp, metrics, openai_batches, openai_files, reports
from .deps import current_caller
from .guards import install_guards


def create_api(settings: Settings | None = None, *, producer: Producer | None = None) -> FastAPI:
    """An API without tokens would serve everyone as no one, and one whose served configs do not
    read would fail its first caller instead of its operator, so either refuses to start."""
    settings = settings or get_settings()
    if not settings.api_tokens:
        raise RuntimeError("GROUNDED_API_TOKENS is not set: give the API at least one token=tenant pair")
    producer = producer or Producer(settings)
    try:
        producer.check_served_configs()
    except BrokenConfig as exc:
        raise RuntimeError(str(exc)) from None

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with mcp_running:
            yield

    # /docs and /redoc from assets shipped in fastapi-offline, not a CDN: the docs work on a network
    # that reaches only the API; no validator badge (it would call validator.swagger.io)
    api = FastAPIOffline(title="grounded-worker", version="0.1.0", lifespan=lifespan,
                         description="Submit question batches; read answers with their citation outcomes.",
                         swagger_ui_parameters={"validatorUrl": None})
    api.state.settings = settings
    api.state.producer = producer
    api.state.openai_batches = OpenAIBatches(producer)
    api.state.batch_waiters = anyio.CapacityLimiter(batches.MAX_WAITERS)
    install_guards(api, max_request_bytes=settings.max_request_bytes)
    api.add_exception_handler(OpenAIRequestError, openai_batches.openai_error)
    api.include_router(health.health)
    api.include_router(metrics.router)
    routers = (batches.batches, jobs.jobs, reports.reports, conversations.conversations, openai_files.files,
               openai_batches.batches)
    for router in routers:
        api.include_router(router, dependencies=[Depends(current_caller)])
    mcp_running = mcp.mount_mcp(api, producer, tokens=settings.api_tokens, max_request_bytes=settings.max_request_bytes)
    return api
