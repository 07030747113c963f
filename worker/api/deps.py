"""What every route shares: the caller's tenant from its bearer token, the producer, and the batch
a tenant owns.

Bearer tokens map to tenants, and a tenant sees only its own batches and jobs: anything else is a
404, so a token cannot even learn that another tenant's batch exists.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from worker.jobs.models import Batch
from worker.producer import Producer

bearer = HTTPBearer(auto_error=False)


@dataclass(frozen=True)
class Caller:
    tenant: str


def producer(request: Request) -> Producer:
    return request.app.state.producer


def current_caller(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> Caller:
    tokens: dict[str, str] = request.app.state.settings.api_tokens
    if credentials is not None:
        presented = credentials.credentials.encode()
        for token, tenant in tokens.items():
            if hmac.compare_digest(presented, token.encode()):
                return Caller(tenant=tenant)
    raise HTTPException(status.HTTP_401_UNAUTHORIZED, "a valid bearer token is required",
                        headers={"WWW-Authenticate": "Bearer"})


ProducerDep = Annotated[Producer, Depends(producer)]
CallerDep = Annotated[Caller, Depends(current_caller)]


def owned_batch(batch_id: str, producer: ProducerDep, caller: CallerDep) -> Batch:
    batch = producer.store.load_batch(batch_id)
    if batch is None or batch.tenant != caller.tenant:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"batch {batch_id!r} not found")
    return batch


OwnedBatch = Annotated[Batch, Depends(owned_batch)]
