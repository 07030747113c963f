"""H14 and H15 without a worker: lease arithmetic, renewal against a real Redis, what counts as a
worker death, and a process loop handing its runs back."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
from celery.worker import state as worker_state

from tests.conftest import RedisSpace
from worker.runtime.loop import ProcessLoop, RunHandedBack, RunTimedOut
from worker.tasks.leases import (
    held_delivery_tags,
    kept_alive,
    renew_held_locks,
    renew_leases,
    renewal_interval_s,
    renewed_scores,
)
from worker.tasks.process import worker_losses


def test_H14_a_lease_is_renewed_several_times_before_it_can_expire() -> None:
    assert renewal_interval_s(10) == 2
    assert renewal_interval_s(10) * 4 < 10, "four missed renewals still leave the lease alive"
    assert renewed_scores(["a", "b"], 100.0) == {"a": 100.0, "b": 100.0}


def test_H14_renewal_extends_held_deliveries_and_never_revives_a_finished_one(redis_space: RedisSpace) -> None:
    client = redis_space.store().redis
    index = f"{redis_space.prefix}unacked_index"
    client.zadd(index, {"held": 1.0, "other-workers": 1.0})
    renew_leases(client, index, ["held", "acked-meanwhile"], now=500.0)
    assert client.zscore(index, "held") == 500.0
    assert client.zscore(index, "other-workers") == 1.0
    assert client.zscore(index, "acked-meanwhile") is None, "XX: an acknowledged delivery stays gone"
    client.delete(index)


def test_H14_held_tags_are_those_of_requests_the_worker_has_not_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    requests = {"a": SimpleNamespace(message=SimpleNamespace(delivery_tag="t1")),
                "b": SimpleNamespace(message=SimpleNamespace(delivery_tag="t2")),
                "c": SimpleNamespace(message=None)}
    monkeypatch.setattr(worker_state, "requests", requests)
    assert held_delivery_tags() == ["t1", "t2"]
    monkeypatch.setattr(worker_state, "requests", {})
    assert held_delivery_tags() == []


class FakeLock:
    def __init__(self, alive: bool = True) -> None:
        self.alive = alive
        self.renewals: list[int] = []

    def renew(self, ttl_s: int) -> bool:
        self.renewals.append(ttl_s)
        return self.alive


def test_H14_a_lock_is_renewed_only_while_its_job_holds_it() -> None:
    lock, lost = FakeLock(), FakeLock(alive=False)
    with kept_alive(lock), kept_alive(lost):
        renew_held_locks(10)
    renew_held_locks(10)
    assert lock.renewals == [10] and lost.renewals == [10]


@pytest.mark.parametrize(
    ("attempts", "retries", "handed_back", "losses"),
    [(1, 0, 0, 0), (3, 0, 0, 2), (3, 2, 0, 0), (4, 1, 2, 0), (5, 1, 1, 2)],
)
def test_H14_H15_worker_losses_exclude_retries_and_hand_backs(attempts: int, retries: int, handed_back: int,
                                                             losses: int) -> None:
    assert worker_losses(attempts, retries, handed_back) == losses


def test_H15_hand_back_cancels_running_runs_and_refuses_new_ones() -> None:
    loop = ProcessLoop()
    try:
        outcome: list[BaseException] = []

        def wait_for_a_long_run() -> None:
            try:
                loop.run(lambda: asyncio.sleep(30), timeout=60)
            except BaseException as exc:  # noqa: BLE001  the test reads what the task would see
                outcome.append(exc)

        waiter = threading.Thread(target=wait_for_a_long_run)
        waiter.start()
        deadline = time.monotonic() + 5
        while not loop._running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert loop.hand_back() == 1
        waiter.join(timeout=5)
        assert len(outcome) == 1 and isinstance(outcome[0], RunHandedBack)
        with pytest.raises(RunHandedBack):
            loop.run(lambda: asyncio.sleep(0), timeout=5)
    finally:
        loop.stop()


def test_a_timed_out_run_is_still_a_timeout_not_a_hand_back() -> None:
    loop = ProcessLoop()
    try:
        with pytest.raises(RunTimedOut):
            loop.run(lambda: asyncio.sleep(5), timeout=0.1)
        assert loop.run(lambda: asyncio.sleep(0, result=7), timeout=5) == 7
    finally:
        loop.stop()
