"""The producer HTTP API (FastAPI): `create_api` only assembles; each resource is a router module."""

from __future__ import annotations

from fastapi import Depends, FastAPI

from worker.producer import Producer
from worker.settings import Settings, get_settings

from . import batches, conversations, health, jobs, metrics, reports
from .deps import current_caller
from .guards import install_guards


def create_api(settings: Settings | None = None, *, producer: Producer | None = None) -> FastAPI:
    """An API without tokens would serve everyone as no one, so it refuses to start."""
    settings = settings or get_settings()
    if not settings.api_tokens:
        raise RuntimeError("GROUNDED_API_TOKENS is not set: give the API at least one token=tenant pair")
    api = FastAPI(title="grounded-worker", version="0.1.0",
                  description="Submit question batches; read answers with their citation outcomes.")
    api.state.settings = settings
    api.state.producer = producer or Producer(settings)
    install_guards(api, max_request_bytes=settings.max_request_bytes)
    api.include_router(health.health)
    api.include_router(metrics.router)
    for router in (batches.batches, jobs.jobs, reports.reports, conversations.conversations):
        api.include_router(router, dependencies=[Depends(current_caller)])
    return api
