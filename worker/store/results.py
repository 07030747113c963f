"""The Redis results store: batches, jobs, results, progress counters and per-batch events.

Key names live here and nowhere else. Every write a redelivered job can repeat is idempotent: a
result overwrites its own key, and a job joins the done set once, so counters and events move once
however often Celery delivers it (acks_late redelivers after a worker dies).
"""

from __future__ import annotations

import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

import redis

from worker.jobs.lines import BatchReport
from worker.jobs.models import Batch, Job, JobResult
from worker.settings import DAY_S, DEFAULT_RETENTION_DAYS

from . import retention
from .keys import (
    ACTIVE_BATCHES_KEY,
    BATCH_CANCEL_KEY,
    BATCH_CANCELLED_JOBS_KEY,
    BATCH_DONE_KEY,
    BATCH_EVENTS_KEY,
    BATCH_FAILED_KEY,
    BATCH_FINISHED_KEY,
    BATCH_JOBS_KEY,
    BATCH_KEY,
    BATCH_RUNNING_KEY,
    BATCH_SUCCEEDED_KEY,
    BATCH_WAITING_KEY,
    JOB_ATTEMPTS_KEY,
    JOB_HANDBACKS_KEY,
    JOB_KEY,
    METRICS_KEY,
    RESULT_KEY,
    TENANT_BATCHES_KEY,
)
from .retention import batch_expiry, live_members
from .scripts import eval_script

EVENTS_MAXLEN = 100_000
WAIT_BLOCK_S = 1.0  # one blocked read of `wait_finished`
BATCH_FINISH_KEYS = 9  # the finishing script's keys that belong to the batch; the 10th is the metrics hash
_COMPRESSED = b"z:"
# a stream holds only strings; these event fields are numbers to whoever reads them (the API's JSON)
EVENT_NUMBERS: dict[str, type[int] | type[float]] = {"total": int, "delay_s": float, "round": int}
EventValue = str | int | float

JobState = Literal["queued", "running", "waiting", "succeeded", "failed", "cancelled"]  # waiting: on its provider (H17)

# Finishing a job: the result, its sets and its events move together, and the events fire only for
# the first write (SADD returns 1), so a redelivered job is counted once.
_FINISH = """
local job_id, blob, status, total = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
if status == 'cancelled' and redis.call('SISMEMBER', KEYS[7], job_id) == 1 then return {0, 0} end
if blob ~= '' then redis.call('SET', KEYS[1], blob) end
local new = redis.call('SADD', KEYS[2], job_id)
if status == 'succeeded' then
  redis.call('SADD', KEYS[3], job_id); redis.call('SREM', KEYS[4], job_id)
elseif status == 'failed' then
  redis.call('SADD', KEYS[4], job_id); redis.call('SREM', KEYS[3], job_id)
end
redis.call('SREM', KEYS[5], job_id)
if new == 1 then
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[5], '*', 'event', ARGV[6], 'job_id', job_id, 'status', status)
end
local finished = 0
if redis.call('SCARD', KEYS[7]) + redis.call('SCARD', KEYS[8]) >= total then
  if redis.call('SETNX', KEYS[9], ARGV[7]) == 1 then
    redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[5], '*', 'event', 'batch_finished')
    finished = 1
  end
end
if new == 1 then
  for i = 8, #ARGV, 2 do redis.call('HINCRBYFLOAT', KEYS[10], ARGV[i], ARGV[i + 1]) end
end
return {new, finished}
"""

# Starting a job: the job, its batch and the batch's cancel flag in one round trip. The batch's key
# is read from the job, so the script builds it from a template (one Redis server, never a cluster).
_LOAD = """
local job = redis.call('GET', KEYS[1])
if not job then return {false, false, 0} end
local batch_id = cjson.decode(job)['batch_id']
local batch = redis.call('GET', (string.gsub(ARGV[1], '{batch_id}', batch_id, 1)))
return {job, batch, redis.call('EXISTS', (string.gsub(ARGV[2], '{batch_id}', batch_id, 1)))}
"""
BATCH_CACHE_SIZE = 256


class AttemptStart(NamedTuple):
    """What `begin_attempt` counted: this start's number, and the earlier runs handed back (H15)."""

    number: int
    handed_back: int


class BatchNotFound(LookupError):
    def __init__(self, batch_id: str) -> None:
        super().__init__(f"batch {batch_id!r} not found in this results store")
        self.batch_id = batch_id


def new_id(kind: str) -> str:
    return f"{kind}_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class BatchProgress:
    batch_id: str
    tenant: str
    total: int
    queued: int
    running: int
    succeeded: int
    failed: int
    cancelled: int
    cancel_requested: bool
    finished: bool
    created_at: datetime
    arm: str | None = None
    waiting: int = 0  # H17: jobs waiting on their provider's batch, holding no worker slot

    @property
    def done(self) -> int:
        return self.succeeded + self.failed

    @property
    def state(self) -> str:
        if self.finished:
            return "cancelled" if self.cancel_requested else "completed"
        if self.cancel_requested:
            return "cancelling"
        return "running" if self.running or self.waiting or self.done or self.cancelled else "queued"

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.batch_id,
            "state": self.state,
            "arm": self.arm,
            "created_at": self.created_at.isoformat(),
            "counts": {
                "total": self.total,
                "queued": self.queued,
                "running": self.running,
                "waiting": self.waiting,
                "succeeded": self.succeeded,
                "failed": self.failed,
                "cancelled": self.cancelled,
            },
            "progress": (self.done + self.cancelled) / self.total if self.total else 1.0,
        }


class ResultsStore:
    """One per process; the Redis client is thread-safe, so the threads pool shares it. `retention_s`
    is how long a batch it stores is kept (H16); only producers store batches."""

    def __init__(self, client: redis.Redis, *, prefix: str = "grounded:", compress_over: int = 16_384,
                 retention_s: float = DEFAULT_RETENTION_DAYS * DAY_S) -> None:
        self.redis, self.prefix, self.compress_over, self.retention_s = client, prefix, compress_over, retention_s
        self._load = client.register_script(_LOAD)
        self._batches: dict[bytes, Batch] = {}  # stored bytes -> parsed, never mutated

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "grounded:", compress_over: int = 16_384,
                 retention_s: float = DEFAULT_RETENTION_DAYS * DAY_S) -> ResultsStore:
        return cls(redis.Redis.from_url(url), prefix=prefix, compress_over=compress_over, retention_s=retention_s)

    def key(self, template: str, **fields: str) -> str:
        return self.prefix + template.format(**fields)

    def retain(self, client: Any, batch_id: str, *keys: str, extend: bool = False, drop: bool = True) -> None:
        """H16: what every write for a batch calls with the keys it wrote (worker.store.retention)."""
        retention.retain(client, self.key(BATCH_KEY, batch_id=batch_id), keys, extend=extend, drop=drop)

    # --- blobs ------------------------------------------------------------------------------------

    def _pack(self, text: str) -> bytes:
        return self._pack_bytes(text.encode())

    def _pack_bytes(self, data: bytes) -> bytes:
        if self.compress_over and len(data) > self.compress_over:
            return _COMPRESSED + zlib.compress(data, 6)
        return data

    @staticmethod
    def _unpack(data: bytes) -> bytes:
        return zlib.decompress(data[len(_COMPRESSED) :]) if data.startswith(_COMPRESSED) else data

    # --- producers --------------------------------------------------------------------------------

    def create_batch(self, report: BatchReport, *, tenant: str, arm: str | None = None) -> tuple[Batch, list[Job]]:
        """Stores a validated batch and its jobs in one transaction; enqueueing comes after."""
        assert report.ok and report.config is not None, "only a batch without errors is stored"
        created_at = datetime.now(UTC)
        expires_at = batch_expiry(created_at, self.retention_s, report.config.retention_days)
        batch = Batch(
            id=new_id("batch"), tenant=tenant, config=report.config, total=len(report.jobs),
            created_at=created_at, arm=arm, expires_at=expires_at,
        )
        jobs = []
        for spec in report.jobs:
            job_id = new_id("job")
            conversation_id = spec.conversation_id or (job_id if spec.kind != "question" else None)
            jobs.append(Job(**{**spec.model_dump(), "conversation_id": conversation_id}, id=job_id, batch_id=batch.id))
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.key(BATCH_KEY, batch_id=batch.id), batch.model_dump_json())
            pipe.pexpireat(self.key(BATCH_KEY, batch_id=batch.id), expires_at)  # the anchor of every other key
            for start in range(0, len(jobs), 1000):
                chunk = jobs[start : start + 1000]
                pipe.rpush(self.key(BATCH_JOBS_KEY, batch_id=batch.id), *[j.id for j in chunk])
                pipe.mset({self.key(JOB_KEY, job_id=j.id): j.model_dump_json() for j in chunk})
                self.retain(pipe, batch.id, *[self.key(JOB_KEY, job_id=j.id) for j in chunk])
            pipe.zadd(self.key(TENANT_BATCHES_KEY, tenant=tenant), {batch.id: batch.created_at.timestamp()})
            pipe.sadd(self.key(ACTIVE_BATCHES_KEY), batch.id)  # H18: left when the batch finishes or goes
            self.retain(pipe, batch.id, self.key(TENANT_BATCHES_KEY, tenant=tenant), extend=True, drop=False)
            self._event(pipe, batch.id, "batch_submitted", total=str(batch.total))
            self.retain(pipe, batch.id, self.key(BATCH_JOBS_KEY, batch_id=batch.id),
                        self.key(BATCH_EVENTS_KEY, batch_id=batch.id))
            pipe.execute()
        return batch, jobs

    def request_cancel(self, batch_id: str) -> None:
        """Queued jobs see the flag when a worker takes them and are skipped without running, so a
        cancelled batch drains in seconds; jobs already running finish and are recorded."""
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.key(BATCH_CANCEL_KEY, batch_id=batch_id), "1")
            self._event(pipe, batch_id, "batch_cancel_requested")
            self.retain(pipe, batch_id, self.key(BATCH_CANCEL_KEY, batch_id=batch_id),
                        self.key(BATCH_EVENTS_KEY, batch_id=batch_id))
            pipe.execute()

    # --- workers ----------------------------------------------------------------------------------

    def load_job(self, job_id: str) -> Job | None:
        data = self.redis.get(self.key(JOB_KEY, job_id=job_id))
        return Job.model_validate_json(data) if data is not None else None

    def load_batch(self, batch_id: str) -> Batch | None:
        data = self.redis.get(self.key(BATCH_KEY, batch_id=batch_id))
        return self._batch(data) if data is not None else None

    def _batch(self, data: bytes) -> Batch:
        """Every job of a batch carries the same config, and validating it is most of reading a
        job: the parsed batch is kept per process while its stored bytes stay the same."""
        batch = self._batches.get(data)
        if batch is None:
            batch = Batch.model_validate_json(data)
            if len(self._batches) >= BATCH_CACHE_SIZE:
                self._batches.pop(next(iter(self._batches)), None)
            self._batches[data] = batch
        return batch

    def load_run(self, job_id: str) -> tuple[Job | None, Batch | None, bool]:
        """What a task needs before it runs a job, in one round trip: the job, its batch and
        whether the batch was cancelled (the same as load_job, load_batch and cancel_requested)."""
        job_data, batch_data, cancel = self._load(
            keys=[self.key(JOB_KEY, job_id=job_id)],
            args=[self.key(BATCH_KEY, batch_id="{batch_id}"), self.key(BATCH_CANCEL_KEY, batch_id="{batch_id}")],
        )
        job = Job.model_validate_json(job_data) if job_data else None
        batch = self._batch(batch_data) if batch_data else None
        return job, batch, bool(cancel)

    def cancel_requested(self, batch_id: str) -> bool:
        return bool(self.redis.exists(self.key(BATCH_CANCEL_KEY, batch_id=batch_id)))

    def begin_attempt(self, job: Job) -> AttemptStart:
        """Counts every start, including a redelivery after a worker died, which Celery's own retry
        counter does not see, and reads how many earlier runs were handed back at a shutdown."""
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.incr(self.key(JOB_ATTEMPTS_KEY, job_id=job.id))
            pipe.get(self.key(JOB_HANDBACKS_KEY, job_id=job.id))
            pipe.sadd(self.key(BATCH_RUNNING_KEY, batch_id=job.batch_id), job.id)
            self._event(pipe, job.batch_id, "job_started", job_id=job.id)
            self.retain(pipe, job.batch_id, self.key(JOB_ATTEMPTS_KEY, job_id=job.id),
                        self.key(BATCH_RUNNING_KEY, batch_id=job.batch_id), self.key(BATCH_EVENTS_KEY, batch_id=job.batch_id))
            attempts, handbacks, *_ = pipe.execute()
        return AttemptStart(int(attempts), int(handbacks or 0))

    def note_handback(self, job: Job) -> None:
        """H15: a run stopped by its worker's shutdown goes back to the queue; it is no death."""
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.incr(self.key(JOB_HANDBACKS_KEY, job_id=job.id))
            pipe.srem(self.key(BATCH_RUNNING_KEY, batch_id=job.batch_id), job.id)
            self._event(pipe, job.batch_id, "job_handed_back", job_id=job.id)
            self.retain(pipe, job.batch_id, self.key(JOB_HANDBACKS_KEY, job_id=job.id),
                        self.key(BATCH_RUNNING_KEY, batch_id=job.batch_id), self.key(BATCH_EVENTS_KEY, batch_id=job.batch_id))
            pipe.execute()

    def note_retry(self, job: Job, *, delay_s: float, error: str) -> None:
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.srem(self.key(BATCH_RUNNING_KEY, batch_id=job.batch_id), job.id)
            self._event(pipe, job.batch_id, "job_retrying", job_id=job.id, delay_s=f"{delay_s:.1f}", error=error[:500])
            self.retain(pipe, job.batch_id, self.key(BATCH_EVENTS_KEY, batch_id=job.batch_id))
            pipe.execute()

    def write_result(self, result: JobResult, *, total: int, metrics: Mapping[str, float] | None = None,
                     alongside: Callable[[Any], None] | None = None) -> bool:
        """Idempotent: returns True only for the write that first counted this job. `metrics`
        (store/metrics.py's counters) are added by that same write, in the same script;
        `alongside` queues more writes on the same transaction (a conversation job's lock release,
        H5), so whoever sees the job finished sees them done."""
        new, _ = self._finish_job(result.batch_id, result.job_id, self._pack(result.model_dump_json()),
                                  result.status, total, "job_finished", metrics=metrics, alongside=alongside)
        return bool(new)

    def mark_cancelled(self, job: Job, *, total: int, metrics: Mapping[str, float] | None = None) -> bool:
        new, _ = self._finish_job(job.batch_id, job.id, b"", "cancelled", total, "job_cancelled",
                                  done_key=BATCH_CANCELLED_JOBS_KEY, metrics=metrics)
        return bool(new)

    def _finish_job(self, batch_id: str, job_id: str, blob: bytes, status: str, total: int, event: str,
                    *, done_key: str = BATCH_DONE_KEY, metrics: Mapping[str, float] | None = None,
                    alongside: Callable[[Any], None] | None = None) -> tuple[int, int]:
        b = {"batch_id": batch_id}
        keys = [
            self.key(RESULT_KEY, job_id=job_id),
            self.key(done_key, **b),
            self.key(BATCH_SUCCEEDED_KEY, **b),
            self.key(BATCH_FAILED_KEY, **b),
            self.key(BATCH_RUNNING_KEY, **b),
            self.key(BATCH_EVENTS_KEY, **b),
            self.key(BATCH_DONE_KEY, **b),
            self.key(BATCH_CANCELLED_JOBS_KEY, **b),
            self.key(BATCH_FINISHED_KEY, **b),
            self.key(METRICS_KEY),
        ]
        now = datetime.now(UTC).isoformat()
        counters = [x for name, value in (metrics or {}).items() for x in (name, repr(float(value)))]
        with self.redis.pipeline(transaction=True) as pipe:
            eval_script(pipe, _FINISH, keys, [job_id, blob, status, total, EVENTS_MAXLEN, event, now, *counters])
            self.retain(pipe, batch_id, *keys[:BATCH_FINISH_KEYS])  # not the deployment's metrics hash
            if alongside is not None:
                alongside(pipe)
            (new, finished), *_ = pipe.execute()
        return int(new), int(finished)

    def _event(self, pipe: Any, batch_id: str, event: str, **fields: str) -> None:
        pipe.xadd(self.key(BATCH_EVENTS_KEY, batch_id=batch_id), {"event": event, **fields},
                  maxlen=EVENTS_MAXLEN, approximate=True)

    # --- readers ----------------------------------------------------------------------------------

    def progress(self, batch_id: str) -> BatchProgress | None:
        """One round trip (the batch and its counts together): it is what every status poll reads."""
        b = {"batch_id": batch_id}
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(self.key(BATCH_KEY, **b))
            for template in (BATCH_SUCCEEDED_KEY, BATCH_FAILED_KEY, BATCH_RUNNING_KEY, BATCH_CANCELLED_JOBS_KEY):
                pipe.scard(self.key(template, **b))
            pipe.exists(self.key(BATCH_CANCEL_KEY, **b))
            pipe.exists(self.key(BATCH_FINISHED_KEY, **b))
            pipe.scard(self.key(BATCH_WAITING_KEY, **b))
            data, succeeded, failed, running, cancelled, cancel, finished, waiting = pipe.execute()
        if data is None:
            return None
        batch = self._batch(data)
        return BatchProgress(
            batch_id=batch.id, tenant=batch.tenant, total=batch.total, arm=batch.arm, created_at=batch.created_at,
            queued=max(0, batch.total - succeeded - failed - running - cancelled - waiting), running=running,
            succeeded=succeeded, failed=failed, cancelled=cancelled, cancel_requested=bool(cancel),
            finished=bool(finished), waiting=waiting,
        )

    def progress_of(self, batch_id: str) -> BatchProgress:
        """Like `progress`, for a batch the caller knows exists: raises BatchNotFound otherwise."""
        progress = self.progress(batch_id)
        if progress is None:
            raise BatchNotFound(batch_id)
        return progress

    def wait_finished(self, batch_id: str, timeout_s: float) -> bool:
        """Blocks until the batch has finished (True) or `timeout_s` has passed (False), reading its
        event stream instead of asking again, so a waiter learns of the end one round trip after it
        and costs nothing while it waits. The finish flag and `batch_finished` are written by one
        script, and the flag and the stream's last id are read in one transaction here, so an end
        between the check and the wait is never missed. A deleted batch waits out the timeout."""
        events = self.key(BATCH_EVENTS_KEY, batch_id=batch_id)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.exists(self.key(BATCH_FINISHED_KEY, batch_id=batch_id))
            pipe.xrevrange(events, count=1)
            finished, last = pipe.execute()
        if finished:
            return True
        after: bytes = last[0][0] if last else b"0-0"
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            # at least a millisecond (0 would block forever), and less than the client's socket
            # timeout (5 s in redis-py), which a blocked read does not extend
            block_ms = max(1, round(min(remaining, WAIT_BLOCK_S) * 1000))
            read: list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]] = self.redis.xread(
                {events: after}, count=1000, block=block_ms)  # type: ignore[assignment]
            for _, entries in read:
                for entry_id, fields in entries:
                    if fields.get(b"event") == b"batch_finished":
                        return True
                    after = entry_id
        return False

    def wait_result(self, job_id: str, batch_id: str, timeout_s: float) -> JobResult | None:
        """The result of a job alone in its batch (a chat turn, an `ask`) once it is written, or None
        after `timeout_s`: such a batch finishes with its job, so this waits on the batch's events."""
        self.wait_finished(batch_id, timeout_s)
        return self.load_result(job_id)

    def finished_at(self, batch_id: str) -> datetime | None:
        """When the batch's last job finished (set once, by the job that finished it)."""
        raw = self.redis.get(self.key(BATCH_FINISHED_KEY, batch_id=batch_id))
        return datetime.fromisoformat(raw.decode()) if raw is not None else None

    def job_ids(self, batch_id: str) -> list[str]:
        return [j.decode() for j in self.redis.lrange(self.key(BATCH_JOBS_KEY, batch_id=batch_id), 0, -1)]

    def job_state(self, job: Job) -> JobState:
        b = {"batch_id": job.batch_id}
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.sismember(self.key(BATCH_SUCCEEDED_KEY, **b), job.id)
            pipe.sismember(self.key(BATCH_FAILED_KEY, **b), job.id)
            pipe.sismember(self.key(BATCH_CANCELLED_JOBS_KEY, **b), job.id)
            pipe.sismember(self.key(BATCH_RUNNING_KEY, **b), job.id)
            pipe.sismember(self.key(BATCH_WAITING_KEY, **b), job.id)
            succeeded, failed, cancelled, running, waiting = pipe.execute()
        if succeeded:
            return "succeeded"
        if failed:
            return "failed"
        if cancelled:
            return "cancelled"
        if running:
            return "running"
        return "waiting" if waiting else "queued"

    def load_result_raw(self, job_id: str) -> bytes | None:
        data = self.redis.get(self.key(RESULT_KEY, job_id=job_id))
        return self._unpack(data) if data is not None else None

    def load_result(self, job_id: str) -> JobResult | None:
        raw = self.load_result_raw(job_id)
        return JobResult.model_validate_json(raw) if raw is not None else None

    def iter_results_raw(self, batch_id: str, *, chunk: int = 200) -> Iterator[bytes]:
        """Finished results in submission order; unfinished jobs are skipped (partial while running)."""
        ids = self.job_ids(batch_id)
        for start in range(0, len(ids), chunk):
            keys = [self.key(RESULT_KEY, job_id=j) for j in ids[start : start + chunk]]
            for data in self.redis.mget(keys):
                if data is not None:
                    yield self._unpack(data)

    def iter_jobs_with_results(self, batch_id: str, *, chunk: int = 200) -> Iterator[tuple[Job, JobResult | None]]:
        """Every job in submission order with its result, or None for one not finished (or cancelled)."""
        ids = self.job_ids(batch_id)
        for start in range(0, len(ids), chunk):
            part = ids[start : start + chunk]
            jobs = self.redis.mget([self.key(JOB_KEY, job_id=j) for j in part])
            results = self.redis.mget([self.key(RESULT_KEY, job_id=j) for j in part])
            for job, result in zip(jobs, results, strict=True):
                if job is not None:
                    yield (Job.model_validate_json(job),
                           JobResult.model_validate_json(self._unpack(result)) if result is not None else None)

    def iter_results(self, batch_id: str) -> Iterator[JobResult]:
        for raw in self.iter_results_raw(batch_id):
            yield JobResult.model_validate_json(raw)

    def events(self, batch_id: str, *, after: str | None = None,
               count: int = 1000) -> list[tuple[str, dict[str, EventValue]]]:
        start = "-" if after is None else event_id_after(after)
        if start is None:
            return []
        entries = self.redis.xrange(self.key(BATCH_EVENTS_KEY, batch_id=batch_id), min=start, count=count)
        return [(eid.decode(), {k.decode(): _event_value(k.decode(), v.decode()) for k, v in fields.items()})
                for eid, fields in entries]

    def tenant_batches(self, tenant: str, *, limit: int = 100) -> list[str]:
        """Newest first; batches that expired or were deleted leave the index here (H16)."""
        return live_members(self.redis, self.key(TENANT_BATCHES_KEY, tenant=tenant), 0, limit - 1,
                            lambda batch_id: self.key(BATCH_KEY, batch_id=batch_id))

    def delete_prefix(self) -> int:
        """Removes every key under this store's prefix: for tests and the demo, which own theirs."""
        removed = 0
        keys: list[bytes] = []
        for key in self.redis.scan_iter(match=f"{self.prefix}*", count=1000):
            keys.append(key)
            if len(keys) >= 500:
                removed += self.redis.delete(*keys)
                keys.clear()
        if keys:
            removed += self.redis.delete(*keys)
        return removed


def _event_value(name: str, text: str) -> EventValue:
    number = EVENT_NUMBERS.get(name)
    if number is None:
        return text
    try:
        return number(text)
    except ValueError:  # written by an older version in another shape: shown as it is
        return text


STREAM_ID_PART_MAX = 2**64 - 1


def event_id_after(after: str) -> str | None:
    """The first stream id that follows `after` (`MS-SEQ`, or `MS` for `MS-0`), or None when none can.

    Redis refuses ids whose parts pass 2**64 - 1 and an exclusive range after the largest id, so the
    successor is computed here and a bad id is a ValueError for the caller to report, not a 500."""
    ms_text, _, seq_text = after.partition("-")
    ms, seq = int(ms_text), int(seq_text or 0)
    if ms > STREAM_ID_PART_MAX or seq > STREAM_ID_PART_MAX:
        raise ValueError(f"event id {after!r} is out of range: each part is at most {STREAM_ID_PART_MAX}")
    if seq < STREAM_ID_PART_MAX:
        return f"{ms}-{seq + 1}"
    return None if ms == STREAM_ID_PART_MAX else f"{ms + 1}-0"
