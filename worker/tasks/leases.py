"""H14: a delivered job is a lease that its live worker keeps renewing.

Redis has no consumer acknowledgements of its own: kombu records each delivered, unacknowledged
message in a sorted set scored by the time it was delivered, and any worker's periodic sweep puts
back on the queue whatever has been there longer than the visibility timeout. With a timeout
longer than the longest job (what Celery's documentation asks), a killed worker's jobs wait that
long, about 17 minutes here; with a short one, a long job still running would be handed to a
second worker. Renewing closes that gap: every few seconds each worker process sets the score of
every delivery it still holds (running, reserved, or waiting on a retry countdown) to now, so the
timeout only has to outlast a missed renewal, not a job. A dead process renews nothing, and its
jobs are swept back `lease_s` after its last renewal.

A conversation's lock (H5) is held the same way, or a redelivered conversation job would wait out
the dead holder's lock for as long as a job may run.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import redis
import structlog
from celery import bootsteps
from celery.worker import state as worker_state

from worker.settings import Settings, get_settings
from worker.store.keys import UNACKED_INDEX_KEY

log = structlog.get_logger()

RENEWALS_PER_LEASE = 5  # a lease survives four missed renewals (a stalled thread, a Redis blip)


def renewal_interval_s(lease_s: float) -> float:
    return max(lease_s / RENEWALS_PER_LEASE, 0.2)


def renewed_scores(tags: Iterable[str], now: float) -> dict[str, float]:
    """The sorted-set scores that extend these leases from `now`."""
    return {tag: now for tag in tags}


def renew_leases(client: redis.Redis, index_key: str, tags: Iterable[str], now: float) -> None:
    """XX only updates members still there: a delivery acknowledged meanwhile, or already swept
    back to the queue by another worker, is never re-added."""
    scores = renewed_scores(tags, now)
    if scores:
        client.zadd(index_key, scores, xx=True)


class Renewable(Protocol):
    def renew(self, ttl_s: int) -> bool: ...


_held: set[Renewable] = set()
_held_lock = threading.Lock()


@contextlib.contextmanager
def kept_alive(lock: Renewable) -> Iterator[None]:
    """Renews `lock` with this process's leases while the block runs."""
    with _held_lock:
        _held.add(lock)
    try:
        yield
    finally:
        with _held_lock:
            _held.discard(lock)


def renew_held_locks(ttl_s: int) -> None:
    with _held_lock:
        held = list(_held)
    for lock in held:
        if not lock.renew(ttl_s):  # expired meanwhile (a stall longer than the lease): say so
            log.warning("lock_lease_lost", lock=repr(lock))


def held_delivery_tags() -> list[str]:
    """The delivery tags of every request this worker holds and has not finished: running,
    reserved, or waiting for its countdown (Celery's worker state, which the consumer thread
    mutates: copy it, retrying a torn read). A request Celery is done with is never renewed, even
    if its acknowledgement or requeue failed (Redis down): its lease then expires and it is swept
    back, instead of being held for ever."""
    for _ in range(5):
        try:
            requests = list(worker_state.requests.values())
            break
        except RuntimeError:  # changed size during iteration
            continue
    else:
        return []
    tags = (getattr(getattr(request, "message", None), "delivery_tag", None) for request in requests)
    return [str(tag) for tag in tags if tag is not None]


class PeriodicConsumerStep(bootsteps.StartStopStep):
    """A consumer bootstep running `tick` on a daemon thread every `interval_s` for as long as the
    process lives. It is replaced when the consumer restarts (a broker reconnection), and it is not
    stopped with the consumer, because a warm shutdown stops consuming first and then lets the
    running jobs finish: what the thread keeps alive must outlive the consumer."""

    requires = ("celery.worker.consumer.tasks:Tasks",)
    thread_name = "grounded-periodic"
    failure_event = "periodic_step_failed"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._stop: threading.Event | None = None

    def interval_s(self, settings: Settings) -> float:
        raise NotImplementedError

    def tick(self, consumer: Any, client: redis.Redis, settings: Settings) -> None:
        raise NotImplementedError

    def start(self, parent: Any) -> None:
        if self._stop is not None:
            self._stop.set()
        settings = get_settings()
        client = redis.Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
        interval = self.interval_s(settings)
        stop = self._stop = threading.Event()

        def tick_until_stopped() -> None:
            while not stop.wait(interval):
                try:
                    self.tick(parent, client, settings)
                except Exception as exc:  # noqa: BLE001 - a dead thread would stop for good; the next tick retries
                    log.warning(self.failure_event, error=f"{type(exc).__name__}: {exc}")
            client.close()

        threading.Thread(target=tick_until_stopped, name=self.thread_name, daemon=True).start()


class LeaseRenewal(PeriodicConsumerStep):
    """Renews this process's leases; one that fails is retried next tick, and the leases last a
    few more renewals meanwhile."""

    thread_name = "grounded-lease-renewal"
    failure_event = "lease_renewal_failed"

    def interval_s(self, settings: Settings) -> float:
        return renewal_interval_s(settings.lease_s)

    def tick(self, consumer: Any, client: redis.Redis, settings: Settings) -> None:
        renew_leases(client, settings.key_prefix + UNACKED_INDEX_KEY, held_delivery_tags(), time.time())
        renew_held_locks(settings.lease_s)
