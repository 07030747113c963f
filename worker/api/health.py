"""`/healthz`: whether the API reaches Redis, for load balancers and probes (no token)."""

from __future__ import annotations

import redis
from fastapi import APIRouter
from fastapi.responses import JSONResponse

from .deps import ProducerDep

health = APIRouter(tags=["health"])


@health.get("/healthz")
def healthz(producer: ProducerDep) -> JSONResponse:
    try:
        producer.store.redis.ping()
    except redis.RedisError as exc:
        return JSONResponse({"status": "unavailable", "redis": str(exc)}, status_code=503)
    return JSONResponse({"status": "ok"})
