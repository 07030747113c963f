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

from worker.interfaces.openai_batch import OpenAIBatches
from worker.jobs.models import Batch
from worker.producer import NotFound, Producer

bearer = HTTPBearer(auto_error=False)


@dataclass(frozen=True)
class Caller:
    tenant: str


# The dependencies that only read the request are `async def`: FastAPI runs a plain `def` dependency
# on a worker thread, and a thread hop for each of them cost more than what they do.


async def producer(request: Request) -> Producer:
    return request.app.state.producer


TOKEN_REQUIRED = "a valid bearer token is required"


def caller_for(tokens: dict[str, str], presented: str) -> Caller | None:
    """The tenant a bearer token stands for; every route and mounted app authenticates through here."""
    for token, tenant in tokens.items():
        if hmac.compare_digest(presented.encode(), token.encode()):
            return Caller(tenant=tenant)
    return None


async def current_caller(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> Caller:
    caller = caller_for(request.app.state.settings.api_tokens, credentials.credentials) if credentials else None
    if caller is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, TOKEN_REQUIRED, headers={"WWW-Authenticate": "Bearer"})
    return caller


ProducerDep = Annotated[Producer, Depends(producer)]
CallerDep = Annotated[Caller, Depends(current_caller)]


def owned_batch(batch_id: str, producer: ProducerDep, caller: CallerDep) -> Batch:
    try:
        return producer.owned_batch(batch_id, caller.tenant)
    except NotFound as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None


OwnedBatch = Annotated[Batch, Depends(owned_batch)]


async def openai_batches(request: Request) -> OpenAIBatches:
    return request.app.state.openai_batches


OpenAIDep = Annotated[OpenAIBatches, Depends(openai_batches)]
