"""OpenAI Batch API records: what a client asked for (endpoint, input file, window, metadata), what
validation refused, and the moments the batch moved (cancel, expiry, finalization), each written
once. An accepted batch's id is its grounded batch's id, so `grounded status` and `/v1/batches`
show the same batch; its progress is read from there, never copied here.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from .keys import OPENAI_BATCH_KEY, TENANT_OPENAI_BATCHES_KEY
from .results import ResultsStore
from .retention import live_members, retain

Moment = Literal["cancelling_at", "expired_at", "finalized"]


class BatchProblem(BaseModel):
    """One refusal: a line of the input file (its number), or the batch as a whole (`line` None)."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None
    custom_id: str | None = None  # when the line was readable, for its error-file line


class OpenAIBatchRecord(BaseModel):
    id: str
    tenant: str
    endpoint: str
    input_file_id: str
    completion_window: str
    metadata: dict[str, str] | None = None
    model: str | None = None  # the served config that answers it (I1)
    created_at: int
    expires_at: int
    errors: list[BatchProblem] = Field(default_factory=list)  # validation refused the batch: nothing ran (I2)


class Finalized(BaseModel):
    """Fixed once the grounded batch has finished: counts, usage and the files that show its results."""

    at: int
    completed: int
    failed: int
    output_file_id: str | None = None
    error_file_id: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0


class Moments(BaseModel):
    cancelling_at: int | None = None
    expired_at: int | None = None
    finalized: Finalized | None = None


class OpenAIBatchStore:
    def __init__(self, results: ResultsStore) -> None:
        self.results = results
        self.redis = results.redis

    def _key(self, batch_id: str) -> str:
        return self.results.key(OPENAI_BATCH_KEY, batch_id=batch_id)

    def _tenant_key(self, tenant: str) -> str:
        return self.results.key(TENANT_OPENAI_BATCHES_KEY, tenant=tenant)

    def create(self, record: OpenAIBatchRecord) -> None:
        """Listed by the time it was stored, to the microsecond: `created_at` has whole seconds, and
        batches created within one second must still page in order. An accepted record lives as long
        as its grounded batch; a refused one, which has none, for the deployment's retention (H16)."""
        key = self._key(record.id)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, "record", record.model_dump_json())
            if record.errors:
                pipe.expire(key, int(self.results.retention_s))
            else:
                self.results.retain(pipe, record.id, key)
            pipe.zadd(self._tenant_key(record.tenant), {record.id: time.time()})
            retain(pipe, key, [self._tenant_key(record.tenant)], extend=True, drop=False)
            pipe.execute()

    def load(self, batch_id: str) -> tuple[OpenAIBatchRecord, Moments] | None:
        raw: dict[Any, Any] = self.redis.hgetall(self._key(batch_id))
        if b"record" not in raw:
            return None
        fields: dict[str, Any] = {k.decode(): v.decode() for k, v in raw.items() if k != b"record"}
        if "finalized" in fields:
            fields["finalized"] = Finalized.model_validate_json(fields["finalized"])
        return OpenAIBatchRecord.model_validate_json(raw[b"record"]), Moments.model_validate(fields)

    def mark(self, batch_id: str, moment: Moment, value: int | Finalized) -> bool:
        """Set once (HSETNX): API replicas that notice the same moment agree on the first."""
        text = value.model_dump_json() if isinstance(value, Finalized) else str(value)
        return bool(self.redis.hsetnx(self._key(batch_id), moment, text))

    def page(self, tenant: str, *, after: str | None, limit: int) -> tuple[list[str], bool]:
        """Newest first; `after` is the last id of the previous page. Raises LookupError for an `after`
        this tenant does not have."""
        start = 0
        if after is not None:
            rank = self.redis.zrevrank(self._tenant_key(tenant), after)
            if rank is None:
                raise LookupError(after)
            start = int(rank) + 1
        ids = live_members(self.redis, self._tenant_key(tenant), start, start + limit, self._key)
        return ids[:limit], len(ids) > limit
