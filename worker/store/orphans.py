"""H18: finding jobs whose message the broker lost.

kombu's Redis transport takes a message with BRPOP and only then records it as unacknowledged
(HSET + ZADD, a second round trip). A Redis killed between the two, or a worker killed between
them, leaves the message in neither place: no lease expires, nothing is swept back, and the job's
batch never finishes. Everywhere else a job always has a copy somewhere (Celery publishes a retry
before acknowledging, a requeue and a sweep are transactions), so an unfinished job of an open
batch with no message on the queue and none unacknowledged was lost in that gap.

A job seen missing once may just be inside the gap; only one still missing a sweep later is
re-sent. A second copy is harmless anyway: runs are idempotent and counted once (H10).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .broker_messages import message_job_id
from .keys import (
    ACTIVE_BATCHES_KEY,
    BATCH_CANCELLED_JOBS_KEY,
    BATCH_DONE_KEY,
    BATCH_FINISHED_KEY,
    BATCH_JOBS_KEY,
    BATCH_KEY,
    JOB_ATTEMPTS_KEY,
    JOB_CHAIN_KEY,
    JOB_HANDBACKS_KEY,
    ORPHAN_SWEEP_CLAIM_KEY,
    ORPHANS_KEY,
    UNACKED_KEY,
    queue_lanes,
)
from .results import ResultsStore

QUEUE_SCAN_MAX = 5000  # a longer queue is not read: a lost job is found once the queue is this short


def confirmed_orphans(missing: Iterable[str], first_missing: Mapping[str, float], now: float,
                      grace_s: float) -> tuple[list[str], dict[str, float]]:
    """Which missing jobs to re-send (missing for at least `grace_s`), and when each job still
    missing was first seen so (a job found again is forgotten)."""
    seen = {job_id: first_missing.get(job_id, now) for job_id in missing}
    return sorted(j for j, since in seen.items() if now - since >= grace_s), seen


@dataclass(frozen=True)
class Orphan:
    """A lost job and what its re-sent message carries so the job goes on where it was: its starts
    so far (each a retry or a death, forgiven: the broker lost it, not the job) and the number of its
    newest provider wait (H17), so the copy is not taken for a stale one."""

    job_id: str
    batch_id: str
    retries: int
    provider_waits: int


class OrphanStore:
    def __init__(self, results: ResultsStore) -> None:
        self.results = results
        self.redis = results.redis

    def _key(self, template: str, **fields: str) -> str:
        return self.results.key(template, **fields)

    def delivered_jobs(self) -> set[str] | None:
        """Every job with a message on the queue or unacknowledged, read in one transaction; None
        when the queue is too long to read."""
        lanes = [self._key(lane) for lane in queue_lanes()]  # both lanes of the queue (H19)
        if sum(self.redis.llen(lane) for lane in lanes) > QUEUE_SCAN_MAX:
            return None
        with self.redis.pipeline(transaction=True) as pipe:
            for lane in lanes:
                pipe.lrange(lane, 0, QUEUE_SCAN_MAX - 1)
            pipe.hvals(self._key(UNACKED_KEY))
            *queued, unacked = pipe.execute()
        messages = [*(raw for lane in queued for raw in lane), *unacked]
        return {job_id for raw in messages if (job_id := message_job_id(raw)) is not None}

    def unfinished_jobs(self) -> dict[str, str]:
        """Job id -> batch id for every job of an open batch without an outcome. A batch that
        finished, expired or was deleted leaves the open set here."""
        open_batches = sorted(b.decode() for b in self.redis.smembers(self._key(ACTIVE_BATCHES_KEY)))
        unfinished: dict[str, str] = {}
        for batch_id in open_batches:
            b = {"batch_id": batch_id}
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.exists(self._key(BATCH_KEY, **b))
                pipe.exists(self._key(BATCH_FINISHED_KEY, **b))
                pipe.lrange(self._key(BATCH_JOBS_KEY, **b), 0, -1)
                pipe.sunion(self._key(BATCH_DONE_KEY, **b), self._key(BATCH_CANCELLED_JOBS_KEY, **b))
                present, finished, jobs, done = pipe.execute()
            if finished or not present:
                self.redis.srem(self._key(ACTIVE_BATCHES_KEY), batch_id)
                continue
            unfinished.update((j.decode(), batch_id) for j in jobs if j not in done)
        return unfinished

    def first_missing(self) -> dict[str, float]:
        return {k.decode(): float(v) for k, v in self.redis.hgetall(self._key(ORPHANS_KEY)).items()}

    def remember_missing(self, seen: Mapping[str, float]) -> None:
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._key(ORPHANS_KEY))
            if seen:
                pipe.hset(self._key(ORPHANS_KEY), mapping={k: f"{v:.3f}" for k, v in seen.items()})
            pipe.execute()

    def orphan(self, job_id: str, batch_id: str) -> Orphan:
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(self._key(JOB_ATTEMPTS_KEY, job_id=job_id))
            pipe.get(self._key(JOB_HANDBACKS_KEY, job_id=job_id))
            pipe.get(self._key(JOB_CHAIN_KEY, job_id=job_id))
            attempts, handbacks, chain = (int(v or 0) for v in pipe.execute())
        return Orphan(job_id, batch_id, retries=max(attempts - handbacks, 0), provider_waits=chain)

    def claim_sweep(self, interval_s: float) -> bool:
        """One worker sweeps per interval; the claim expires on its own."""
        claim = self._key(ORPHAN_SWEEP_CLAIM_KEY)
        return bool(self.redis.set(claim, "1", nx=True, px=max(1, int(interval_s * 1000))))
