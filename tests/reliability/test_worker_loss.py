"""Worker loss: kill -9 worker main processes and prefork pool children while they run jobs.

Jobs are acknowledged late, so a killed job stays in Redis: a prefork parent requeues a dead
child's job at once, and a dead main process's jobs come back when their leases expire (H14). The
results store counts each job once however often it runs. These tests check the whole chain with
real workers, a real Redis and a model that takes about a second per request: every job ends in
the results exactly once, nothing is lost, and every job that was killed mid-run ran again.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import psutil
import pytest

from tests.reliability.conftest import (
    Fleet,
    descendants,
    endpoint_config,
    wait_for_running_job,
)
from tests.worker.fake_openai import FAKE_ANSWER
from worker.jobs.models import JobResult

pytestmark = pytest.mark.slow

THREAD_MAIN_KILLS = 6
PREFORK_CHILD_KILLS = 6
PREFORK_MAIN_KILLS = 2


def delayed_lines(n: int, tag: str) -> list[dict[str, Any]]:
    return [{"custom_id": f"{tag}-{i}", "question": f"[delay] When does the observatory open? ({tag} {i})"}
            for i in range(n)]


def assert_each_job_once(fleet: Fleet, batch_id: str, custom_ids: list[str], timeout: float) -> dict[str, JobResult]:
    """No loss (every job has a result), no double count (each job finished once in the counters,
    the events and the results), and every result is a real answer."""
    progress = fleet.wait(batch_id, timeout=timeout)
    n = len(custom_ids)
    assert (progress.succeeded, progress.failed, progress.cancelled, progress.done) == (n, 0, 0, n)
    results = list(fleet.store.iter_results(batch_id))
    assert sorted(r.custom_id for r in results) == sorted(custom_ids)
    events = [fields for _, fields in fleet.store.events(batch_id)]
    finished = Counter(e["job_id"] for e in events if e["event"] == "job_finished")
    assert len(finished) == n and set(finished.values()) == {1}
    assert sum(e["event"] == "batch_finished" for e in events) == 1
    assert all(r.status == "succeeded" and r.turns[0].answer == FAKE_ANSWER for r in results)
    assert all(r.turns[0].citation_status == "grounded" for r in results)
    return {r.job_id: r for r in results}


def test_thread_workers_killed_mid_job_lose_and_double_count_nothing(redis_space, fleet_for, faulty_openai) -> None:
    fleet = fleet_for(redis_space)
    workers = [fleet.start(), fleet.start()]
    lines = delayed_lines(36, "threads")  # enough work left for six kills, with leases recovering in seconds
    batch_id = fleet.submit(lines, endpoint_config(faulty_openai))
    interrupted: set[str] = set()
    for k in range(THREAD_MAIN_KILLS):
        target = workers[k % 2]
        task = wait_for_running_job(fleet, target, child=False)
        running = {t["id"] for t in fleet.active(target)}
        fleet.kill(target.process.pid, "threads worker main process", task["id"])
        target.process.wait(timeout=5)
        interrupted |= running
        workers[k % 2] = fleet.start()
    results = assert_each_job_once(fleet, batch_id, [line["custom_id"] for line in lines], timeout=150)
    assert len(fleet.kills) == THREAD_MAIN_KILLS
    assert interrupted and all(results[job_id].attempts >= 2 for job_id in interrupted)


def test_prefork_children_killed_mid_job_are_requeued_and_counted_once(redis_space, fleet_for, faulty_openai) -> None:
    fleet = fleet_for(redis_space)
    worker = fleet.start(pool="prefork", concurrency=3)
    lines = delayed_lines(20, "child")
    batch_id = fleet.submit(lines, endpoint_config(faulty_openai))
    interrupted: list[str] = []
    for _ in range(PREFORK_CHILD_KILLS):
        task = wait_for_running_job(fleet, worker, child=True)
        fleet.kill(task["worker_pid"], "prefork pool child", task["id"])
        interrupted.append(task["id"])
        time.sleep(0.5)
    results = assert_each_job_once(fleet, batch_id, [line["custom_id"] for line in lines], timeout=150)
    assert worker.process.poll() is None, "the parent survives its children"
    assert len(fleet.kills) == PREFORK_CHILD_KILLS
    losses = Counter(interrupted)
    assert all(results[job_id].attempts >= 1 + killed for job_id, killed in losses.items())


def test_prefork_main_process_killed_mid_job_takes_its_children_and_loses_nothing(
    redis_space, fleet_for, faulty_openai
) -> None:
    fleet = fleet_for(redis_space)
    workers = [fleet.start(pool="prefork", concurrency=2), fleet.start(pool="prefork", concurrency=2)]
    lines = delayed_lines(10, "main")
    batch_id = fleet.submit(lines, endpoint_config(faulty_openai))
    interrupted: set[str] = set()
    for k in range(PREFORK_MAIN_KILLS):
        target = workers[k]
        task = wait_for_running_job(fleet, target, child=True)
        children = descendants(target.process.pid)
        fleet.kill(target.process.pid, "prefork worker main process", task["id"])
        target.process.wait(timeout=5)
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, "orphaned pool children would finish jobs that Redis also hands to another worker"
        interrupted.add(task["id"])
        workers[k] = fleet.start(pool="prefork", concurrency=2)
    results = assert_each_job_once(fleet, batch_id, [line["custom_id"] for line in lines], timeout=150)
    assert len(fleet.kills) == PREFORK_MAIN_KILLS
    assert all(results[job_id].attempts >= 2 for job_id in interrupted)
