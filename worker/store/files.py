"""Files as the OpenAI Files API knows them: uploads (a batch's JSONL input) and the output and
error files of a batch, each owned by one tenant.

An upload keeps its bytes (compressed like results) for FILE_TTL_S, as OpenAI keeps batch inputs:
a batch no longer needs its input once its jobs are stored. A batch's output and error files are
views of its stored results, rendered when read (worker.interfaces.openai_batch), so they hold no
copy of the answers and go when the results go.
"""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel

from .keys import FILE_KEY, OPENAI_BATCH_KEY
from .results import ResultsStore
from .retention import retain

FILE_TTL_S = 30 * 24 * 3600
FileView = Literal["output", "errors"]


class StoredFile(BaseModel):
    id: str
    tenant: str
    filename: str
    purpose: str  # "batch" for uploads, "batch_output" for a batch's output and error files
    bytes: int
    created_at: int  # Unix seconds, as the File object carries it
    expires_at: int | None = None
    view_of: str | None = None  # the batch whose results this file shows...
    view: FileView | None = None  # ...and which of its files it is


def view_file_id(batch_id: str, view: FileView) -> str:
    """Derived from the batch, so two API replicas finalizing one batch name the same files, and
    deleting the batch finds them (worker.store.deletion)."""
    return f"file-{batch_id.removeprefix('batch_')}-{view}"


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


class FileStore:
    """Beside the results store, under the same prefix and Redis client."""

    def __init__(self, results: ResultsStore) -> None:
        self.results = results
        self.redis = results.redis

    def _key(self, file_id: str) -> str:
        return self.results.key(FILE_KEY, file_id=file_id)

    def upload(self, *, tenant: str, filename: str, purpose: str, content: bytes, now: int) -> StoredFile:
        stored = StoredFile(id=new_file_id(), tenant=tenant, filename=filename, purpose=purpose,
                            bytes=len(content), created_at=now, expires_at=now + FILE_TTL_S)
        key = self._key(stored.id)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"meta": stored.model_dump_json(), "content": self.results._pack_bytes(content)})
            pipe.expire(key, FILE_TTL_S)
            pipe.execute()
        return stored

    def add_view(self, stored: StoredFile) -> StoredFile:
        """Idempotent: the first description of a view stays (two readers may finalize one batch)."""
        assert stored.view_of is not None and stored.view is not None, "a view names its batch and kind"
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hsetnx(self._key(stored.id), "meta", stored.model_dump_json())
            retain(pipe, self.results.key(OPENAI_BATCH_KEY, batch_id=stored.view_of), [self._key(stored.id)])
            pipe.execute()
        loaded = self.load(stored.id)
        assert loaded is not None
        return loaded

    def load(self, file_id: str) -> StoredFile | None:
        raw = self.redis.hget(self._key(file_id), "meta")
        return StoredFile.model_validate_json(raw) if raw is not None else None

    def content(self, file_id: str) -> bytes | None:
        """An upload's bytes; None for a view (or an expired upload)."""
        raw = self.redis.hget(self._key(file_id), "content")
        return self.results._unpack(raw) if raw is not None else None
