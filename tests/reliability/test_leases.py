"""H14 and H15: jobs held as leases that expire with their worker, and graceful stops that hand back.

Real workers, a real Redis and the fake model server with per-request delays. Recovery runs on the
production defaults (a 10 s lease renewed every 2 s, swept every 2 s) unless a test says otherwise.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import time
from typing import Any

import pytest

from tests.reliability.conftest import Fleet, endpoint_config, wait_for_running_job
from tests.worker.fake_openai import FAKE_ANSWER
from worker.settings import Settings

pytestmark = pytest.mark.slow

DEFAULTS = Settings()
# a killed worker's job is back on the queue a lease after the last renewal, plus one sweep
RECOVERY_BOUND_S = DEFAULTS.lease_s + DEFAULTS.unacked_restore_interval_s
STARTED_BY = 12  # seconds a free worker may take, on a loaded 2-core machine, to take a queued job


def lines(n: int, tag: str, delay_s: float) -> list[dict[str, Any]]:
    return [{"custom_id": f"{tag}-{i}", "question": f"[delay:{delay_s}] When does the observatory open? ({tag} {i})"}
            for i in range(n)]


def event_times(fleet: Fleet, batch_id: str, event: str) -> dict[str, list[float]]:
    """job id -> when each such event happened (stream ids are milliseconds since the epoch)."""
    times: dict[str, list[float]] = {}
    for entry_id, fields in fleet.store.events(batch_id):
        if fields["event"] == event:
            times.setdefault(str(fields["job_id"]), []).append(int(str(entry_id).split("-")[0]) / 1000)
    return times


def assert_each_once(fleet: Fleet, batch_id: str, n: int, timeout: float) -> None:
    progress = fleet.wait(batch_id, timeout=timeout)
    assert (progress.succeeded, progress.failed, progress.done) == (n, 0, n)
    results = list(fleet.store.iter_results(batch_id))
    assert len({r.job_id for r in results}) == n and all(r.turns[0].answer == FAKE_ANSWER for r in results)
    finished = event_times(fleet, batch_id, "job_finished")
    assert len(finished) == n and all(len(t) == 1 for t in finished.values())


def test_H14_a_live_worker_keeps_a_job_for_longer_than_its_lease(redis_space, fleet_for, faulty_openai) -> None:
    """A 3 s lease and a job of about 9 s: renewed, it is never handed to the idle second worker."""
    fleet = fleet_for(redis_space, GROUNDED_LEASE_S="3", GROUNDED_TASK_SOFT_LIMIT_S="60",
                      GROUNDED_TASK_HARD_LIMIT_S="60")
    fleet.start(), fleet.start()
    batch_id = fleet.submit(lines(2, "long", 3.0), endpoint_config(faulty_openai))
    assert_each_once(fleet, batch_id, 2, timeout=60)
    assert all(r.attempts == 1 for r in fleet.store.iter_results(batch_id))
    assert all(len(t) == 1 for t in event_times(fleet, batch_id, "job_started").values())


def test_H14_a_killed_workers_jobs_restart_on_another_worker_within_a_lease(
    redis_space, fleet_for, faulty_openai
) -> None:
    """kill -9 with default time limits (600 s a job): the jobs come back in seconds, not minutes."""
    fleet = fleet_for(redis_space, GROUNDED_TASK_SOFT_LIMIT_S=None, GROUNDED_TASK_HARD_LIMIT_S=None)
    doomed = fleet.start(concurrency=3)
    batch_id = fleet.submit(lines(3, "killed", 2.0), endpoint_config(faulty_openai))
    wait_for_running_job(fleet, doomed, child=False)
    running = {t["id"] for t in fleet.active(doomed)}
    survivor = fleet.start(concurrency=3)
    os.kill(doomed.process.pid, signal.SIGKILL)
    killed_at = time.time()
    assert_each_once(fleet, batch_id, 3, timeout=90)
    restarts = event_times(fleet, batch_id, "job_started")
    delays = [max(restarts[job_id]) - killed_at for job_id in running]
    print(f"restart after kill -9: {[round(d, 1) for d in delays]} s (bound {RECOVERY_BOUND_S} s)")
    assert delays and max(delays) <= RECOVERY_BOUND_S + STARTED_BY
    assert all(len(restarts[job_id]) == 2 for job_id in running)
    assert survivor.process.poll() is None


def test_H15_sigterm_lets_short_jobs_finish_and_hands_long_ones_back_when_the_window_ends(
    redis_space, fleet_for, faulty_openai
) -> None:
    window_s = 10.0
    fleet = fleet_for(redis_space, GROUNDED_SOFT_SHUTDOWN_S=str(window_s), GROUNDED_TASK_SOFT_LIMIT_S="120",
                      GROUNDED_TASK_HARD_LIMIT_S="120")
    stopping = fleet.start(concurrency=2)
    warm = fleet.submit(lines(1, "warm", 0.0), endpoint_config(faulty_openai))  # agent and client built
    fleet.wait(warm, timeout=60)
    short_batch = fleet.submit(lines(1, "short", 0.2), endpoint_config(faulty_openai))
    long_batch = fleet.submit(lines(1, "long", 8.0), endpoint_config(faulty_openai))
    wait_for_running_job(fleet, stopping, child=False)
    while len(fleet.active(stopping)) < 2:
        time.sleep(0.1)
    stopping.process.send_signal(signal.SIGTERM)
    stopped_at = time.time()
    fleet.start(concurrency=2)
    stopping.process.wait(timeout=window_s + 20)
    print(f"stopped {time.time() - stopped_at:.1f} s after SIGTERM (window {window_s} s)")

    assert_each_once(fleet, short_batch, 1, timeout=30)
    [short] = fleet.store.iter_results(short_batch)
    assert short.attempts == 1, "a job that fits in the window finishes where it started"

    assert_each_once(fleet, long_batch, 1, timeout=60)
    [long] = fleet.store.iter_results(long_batch)
    assert long.attempts == 2
    [handed_back] = event_times(fleet, long_batch, "job_handed_back").values()
    [first, second] = next(iter(event_times(fleet, long_batch, "job_started").values()))
    print(f"handed back {handed_back[0] - stopped_at:.1f} s after SIGTERM; restarted {second - handed_back[0]:.1f} s later")
    assert window_s - 0.5 <= handed_back[0] - stopped_at <= window_s + 3
    assert second - (stopped_at + window_s) <= 5 + 3, "restarted elsewhere within 5 s of the window's end"


def test_H15_a_stop_with_nothing_running_ends_at_once(redis_space, fleet_for) -> None:
    fleet = fleet_for(redis_space, GROUNDED_SOFT_SHUTDOWN_S="60")
    idle = fleet.start()
    started = time.monotonic()
    idle.process.send_signal(signal.SIGTERM)
    idle.process.wait(timeout=30)
    assert time.monotonic() - started < 15, "no job to wait for: the window is not slept out"


def test_H15_hand_backs_are_not_worker_losses(redis_space, fleet_for, faulty_openai) -> None:
    """GROUNDED_MAX_WORKER_LOSSES=1: a job handed back twice still runs to its answer."""
    fleet = fleet_for(redis_space, GROUNDED_SOFT_SHUTDOWN_S="0.5", GROUNDED_MAX_WORKER_LOSSES="1",
                      GROUNDED_TASK_SOFT_LIMIT_S="120", GROUNDED_TASK_HARD_LIMIT_S="120")
    batch_id = fleet.submit(lines(1, "handed", 1.5), endpoint_config(faulty_openai))
    for _ in range(2):
        worker = fleet.start(concurrency=1)
        wait_for_running_job(fleet, worker, child=False)
        worker.process.send_signal(signal.SIGTERM)
        worker.process.wait(timeout=30)
    fleet.start(concurrency=1)
    assert_each_once(fleet, batch_id, 1, timeout=60)
    [result] = fleet.store.iter_results(batch_id)
    assert result.status == "succeeded" and result.attempts == 3


BATCH = 300
KILLS = 20


def run_batch(fleet: Fleet, server: Any, tag: str, *, kills: int) -> tuple[float, list[float]]:
    """300 questions on `grounded worker --processes 3 --concurrency 8`; `kills` kill -9s of busy
    worker processes at random 1-3 s intervals, each forked again by the supervisor. Returns the
    batch's wall time and, per killed running job, how long after the kill it started again (H14, H19)."""
    group = fleet.start_group(processes=3, concurrency=8)
    started = time.time()
    batch_id = fleet.submit(lines(BATCH, tag, 1.5), endpoint_config(server))
    killed: list[tuple[float, set[str]]] = []
    rng = random.Random(19)
    for k in range(kills):
        time.sleep(rng.uniform(1, 3))
        target = group.names[k % 3]
        running = {t["id"] for t in fleet.active(target)}
        fleet.kill(fleet.pid_of(target), "supervised worker process", ",".join(sorted(running)))
        killed.append((time.time(), running))
    assert_each_once(fleet, batch_id, BATCH, timeout=600)
    finished = {job: ts[0] for job, ts in event_times(fleet, batch_id, "job_finished").items()}
    wall = max(finished.values()) - started
    starts = event_times(fleet, batch_id, "job_started")
    delays: list[float] = []
    for k, (at, running) in enumerate(killed):  # shown when the test fails: which kill's jobs waited
        # a job listed as running may have finished in the moment before the kill: it was not killed
        restarts = [min((t for t in starts[job] if t > at), default=float("inf")) - at
                    for job in running if finished[job] > at]
        print(f"kill {k} at {at - started:.1f} s: {len(running)} runs, restarted after",
              " ".join(f"{d:.1f}" for d in sorted(restarts)), "s")
        delays += restarts
    return wall, delays


@pytest.mark.timeout(900)
def test_H14_twenty_kills_during_a_300_job_batch_lose_nothing_and_cost_little(
    redis_space, fleet_for, faulty_openai
) -> None:
    """With default time limits: nothing lost or counted twice, and a killed job starts again within
    30 s (p95). The wall-time ratio against the same batch without faults (goal ≤ 1.5×) is measured
    and printed, not asserted (docs/reliability.md keeps the latest figure)."""
    calm = fleet_for(redis_space, GROUNDED_TASK_SOFT_LIMIT_S=None, GROUNDED_TASK_HARD_LIMIT_S=None)
    calm_wall, _ = run_batch(calm, faulty_openai, "calm", kills=0)
    calm.close()
    faulty = fleet_for(redis_space, GROUNDED_TASK_SOFT_LIMIT_S=None, GROUNDED_TASK_HARD_LIMIT_S=None)
    wall, delays = run_batch(faulty, faulty_openai, "kills", kills=KILLS)
    p95 = statistics.quantiles(delays, n=20)[-1] if len(delays) >= 2 else max(delays)
    print(f"\n{BATCH} jobs, 3 workers x 8: {calm_wall:.1f} s without faults, {wall:.1f} s with {KILLS} kill -9s "
          f"({wall / calm_wall:.2f}x); {len(delays)} killed runs restarted after p50 "
          f"{statistics.median(delays):.1f} s, p95 {p95:.1f} s, max {max(delays):.1f} s")
    assert p95 <= 30
