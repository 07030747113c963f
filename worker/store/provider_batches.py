"""Provider batch mode in Redis (H17): a suspended question's checkpoint, which jobs wait on which
provider batch, and which of a batch's requests nobody will collect.

A job in batch mode ends its task once its model request is in a provider batch, so what it has done
so far must outlive the task and the worker: the run's history (ending in pydantic-ai's suspended
response, which holds the batch ticket) and its `deps.state` are saved here together, like a
conversation commit (H4), before the task lets go. Whichever worker resumes the job reads them back
and checks the same batch instead of submitting the request again.

Provider batches are shared by the jobs one worker process ran, whatever their grounded batch, so a
provider batch is cancelled only once every request in it is abandoned (H17); the counts that decide
it are kept here, across processes.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from worker.jobs.models import Job

from .keys import (
    BATCH_EVENTS_KEY,
    BATCH_PROVIDER_BATCHES_KEY,
    BATCH_RUNNING_KEY,
    BATCH_WAITING_KEY,
    JOB_CHAIN_KEY,
    JOB_DETACHED_KEY,
    JOB_PENDING_KEY,
    METRICS_KEY,
    PROVIDER_BATCH_ABANDONED_KEY,
    PROVIDER_BATCH_JOBS_KEY,
    PROVIDER_BATCH_KEY,
    PROVIDER_WAITING_KEY,
)
from .results import EVENTS_MAXLEN, ResultsStore

PROVIDER_BATCHES_COUNTER = "provider_batches"  # metrics hash fields (store/metrics.py reads them)
PROVIDER_ROUNDS_COUNTER = "provider_rounds"

# The job's checkpoint is saved only over the version its run resumed from (a compare-and-set, like
# H4's commit), so two deliveries of one job cannot both carry it on. The first job to wait on a
# provider batch records its handle and counts it, once; the waiting sets and the event move with it.
_SUSPEND = """
local version = tonumber(redis.call('HGET', KEYS[2], 'version') or '0')
if version ~= tonumber(ARGV[10]) then return -1 end
local new_batch = redis.call('HSETNX', KEYS[1], 'handle', ARGV[1])
redis.call('HSET', KEYS[2], 'data', ARGV[2], 'version', version + 1)
redis.call('SADD', KEYS[3], ARGV[3])
redis.call('SADD', KEYS[4], ARGV[3]); redis.call('SADD', KEYS[5], ARGV[3]); redis.call('SREM', KEYS[6], ARGV[3])
redis.call('SADD', KEYS[7], ARGV[4])
redis.call('HINCRBYFLOAT', KEYS[8], ARGV[7], 1)
if new_batch == 1 then redis.call('HINCRBYFLOAT', KEYS[8], ARGV[8], 1) end
redis.call('XADD', KEYS[9], 'MAXLEN', '~', ARGV[9], '*', 'event', 'job_waiting', 'job_id', ARGV[3],
           'provider_batch', ARGV[4], 'round', ARGV[5], 'delay_s', ARGV[6])
return new_batch
"""

# A request is abandoned once; the batch is cancelled by whoever abandons its last request, once.
_ABANDON = """
redis.call('SADD', KEYS[1], ARGV[1])
local handle = redis.call('HGET', KEYS[2], 'handle')
if not handle then return false end
local count = tonumber(cjson.decode(handle)['request_count'])
if redis.call('SCARD', KEYS[1]) < count then return false end
if redis.call('HSETNX', KEYS[2], 'cancelled', '1') == 0 then return false end
return handle
"""


_NEWEST = """
if tonumber(ARGV[1]) > tonumber(redis.call('GET', KEYS[1]) or '0') then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"""


class PendingRound(BaseModel):
    """A question suspended on its provider: everything a later run resumes from (H4's pair, plus the
    requests sent so far, which the result's `wire` reports)."""

    turn: int  # which of the job's questions (a conversation's earlier turns are committed already)
    messages_json: str  # the whole history, ending in the suspended response with its batch ticket
    state: dict[str, Any] = Field(default_factory=dict)
    wire_json: list[str] = Field(default_factory=list)  # each request as sent, ModelMessagesTypeAdapter JSON
    provider_batch: str  # the provider batch its request waits on
    custom_id: str  # the request's id in that batch
    round: int  # provider round trips started so far in this job


class RoundSuperseded(RuntimeError):
    """Another delivery of this job saved a round since this run loaded its own (a redelivery racing
    the original): this run's work is dropped and the other carries the job on."""


class ProviderBatchStore:
    """Beside the results store, under the same prefix and Redis client."""

    def __init__(self, results: ResultsStore) -> None:
        self.results = results
        self.redis = results.redis
        self._suspend = self.redis.register_script(_SUSPEND)
        self._abandon = self.redis.register_script(_ABANDON)
        self._newest = self.redis.register_script(_NEWEST)

    def _key(self, template: str, **fields: str) -> str:
        return self.results.key(template, **fields)

    def load_pending(self, job_id: str) -> tuple[PendingRound | None, int]:
        """The saved round, if any, and the version a later `suspend` must find."""
        raw, version = self.redis.hmget(self._key(JOB_PENDING_KEY, job_id=job_id), "data", "version")
        pending = PendingRound.model_validate_json(self.results._unpack(raw)) if raw is not None else None
        return pending, int(version or 0)

    def suspend(self, job: Job, pending: PendingRound, *, handle: dict[str, Any], delay_s: float,
                version: int) -> bool:
        """Saves the checkpoint over `version` and files the job as waiting on its provider batch;
        True when this is the first job seen waiting on that batch. Raises RoundSuperseded, having
        written nothing, when another delivery saved a round first."""
        b, p = {"batch_id": job.batch_id}, {"provider_batch_id": pending.provider_batch}
        keys = [
            self._key(PROVIDER_BATCH_KEY, **p),
            self._key(JOB_PENDING_KEY, job_id=job.id),
            self._key(PROVIDER_BATCH_JOBS_KEY, **p),
            self._key(BATCH_WAITING_KEY, **b),
            self._key(PROVIDER_WAITING_KEY),
            self._key(BATCH_RUNNING_KEY, **b),
            self._key(BATCH_PROVIDER_BATCHES_KEY, **b),
            self._key(METRICS_KEY),
            self._key(BATCH_EVENTS_KEY, **b),
        ]
        args = [json.dumps(handle, separators=(",", ":")), self.results._pack(pending.model_dump_json()), job.id,
                pending.provider_batch, pending.round, f"{delay_s:.1f}", PROVIDER_ROUNDS_COUNTER,
                PROVIDER_BATCHES_COUNTER, EVENTS_MAXLEN, version]
        outcome = int(self._suspend(keys=keys, args=args))
        if outcome < 0:
            raise RoundSuperseded(f"job {job.id}: another delivery saved a round since version {version}")
        return bool(outcome)

    def next_check(self, provider_batch: str) -> float | None:
        """When the provider batch is next due to be checked (epoch seconds), as its last check said."""
        raw = self.redis.hget(self._key(PROVIDER_BATCH_KEY, provider_batch_id=provider_batch), "next_check")
        return float(raw) if raw is not None else None

    def set_next_check(self, provider_batch: str, at: float) -> None:
        self.redis.hset(self._key(PROVIDER_BATCH_KEY, provider_batch_id=provider_batch), "next_check", f"{at:.3f}")

    def scheduled(self, job: Job, wait: int) -> None:
        """Records the number of the delivery a provider wait just sent (after sending it, so a worker
        dying in between leaves the older delivery current); numbers only ever grow."""
        self._newest(keys=[self._key(JOB_CHAIN_KEY, job_id=job.id)], args=[wait])

    def stale(self, job: Job, wait: int) -> bool:
        """A delivery older than the newest one scheduled: a copy of the job's message that a dead
        worker left behind (Redis hands back every message it held, one it had already replaced by
        the next among them), whose chain of deliveries must stop. A delivery that runs before its
        number was recorded is newer, not stale."""
        newest = self.redis.get(self._key(JOB_CHAIN_KEY, job_id=job.id))
        return wait < int(newest or 0)

    def detach(self, job: Job, *, lease_s: float) -> None:
        """The job's run goes on in its worker's event loop, waiting for its request to be submitted,
        and its slot is free: the lease keeps other deliveries from resuming the job meanwhile, and
        expires on its own if that worker dies."""
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self._key(JOB_DETACHED_KEY, job_id=job.id), "1", px=max(1, int(lease_s * 1000)))
            self._move_to_waiting(pipe, job)
            pipe.execute()

    def detached_for(self, job: Job) -> float:
        """Seconds left on the job's detached run's lease; 0 when none runs."""
        left = int(self.redis.pttl(self._key(JOB_DETACHED_KEY, job_id=job.id)))
        return left / 1000 if left > 0 else 0.0

    def release_detached(self, job: Job) -> None:
        self.redis.delete(self._key(JOB_DETACHED_KEY, job_id=job.id))

    def _move_to_waiting(self, pipe: Any, job: Job) -> None:
        b = {"batch_id": job.batch_id}
        pipe.srem(self._key(BATCH_RUNNING_KEY, **b), job.id)
        pipe.sadd(self._key(BATCH_WAITING_KEY, **b), job.id)
        pipe.sadd(self._key(PROVIDER_WAITING_KEY), job.id)

    def still_waiting(self, job: Job) -> None:
        """A delivery that found its provider batch checked recently goes back to waiting unrun."""
        with self.redis.pipeline(transaction=True) as pipe:
            self._move_to_waiting(pipe, job)
            pipe.execute()

    def resumed(self, job: Job) -> None:
        """The job holds a worker slot again; it still has its checkpoint until its question completes."""
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.srem(self._key(BATCH_WAITING_KEY, batch_id=job.batch_id), job.id)
            pipe.srem(self._key(PROVIDER_WAITING_KEY), job.id)
            pipe.execute()

    def discard_pending(self, job: Job) -> None:
        """The question completed (or the job ended): nothing is left to resume."""
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self._key(JOB_PENDING_KEY, job_id=job.id), "data")  # the version stays: it only grows
            pipe.srem(self._key(BATCH_WAITING_KEY, batch_id=job.batch_id), job.id)
            pipe.srem(self._key(PROVIDER_WAITING_KEY), job.id)
            pipe.execute()

    def abandon(self, job: Job, pending: PendingRound) -> dict[str, Any] | None:
        """Records that nobody will collect this job's request. Returns the provider batch's handle when
        every request in it is now abandoned (the caller cancels it), once per batch."""
        p = {"provider_batch_id": pending.provider_batch}
        keys = [self._key(PROVIDER_BATCH_ABANDONED_KEY, **p), self._key(PROVIDER_BATCH_KEY, **p)]
        handle = self._abandon(keys=keys, args=[f"{job.id}:{pending.custom_id}"])
        self.discard_pending(job)
        return json.loads(handle) if handle else None

    def note_cancelled(self, job: Job, provider_batch: str) -> None:
        self.redis.xadd(self._key(BATCH_EVENTS_KEY, batch_id=job.batch_id),
                        {"event": "provider_batch_cancelled", "provider_batch": provider_batch},
                        maxlen=EVENTS_MAXLEN, approximate=True)

    def waiting_jobs(self, batch_id: str) -> list[str]:
        return sorted(j.decode() for j in self.redis.smembers(self._key(BATCH_WAITING_KEY, batch_id=batch_id)))

    def provider_batches(self, batch_id: str) -> list[str]:
        return sorted(p.decode() for p in self.redis.smembers(self._key(BATCH_PROVIDER_BATCHES_KEY,
                                                                             batch_id=batch_id)))

    def cancelled(self, provider_batch: str) -> bool:
        return bool(self.redis.hexists(self._key(PROVIDER_BATCH_KEY, provider_batch_id=provider_batch), "cancelled"))

    def waiting_count(self) -> int:
        return int(self.redis.scard(self._key(PROVIDER_WAITING_KEY)))
