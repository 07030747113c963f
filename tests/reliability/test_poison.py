"""Poison jobs: a job that kills the worker running it, on every attempt.

acks_late and reject_on_worker_lost redeliver a job whose worker died, which is right for a worker
lost to a deploy or a crashed machine, and wrong for a job that is itself the cause (out of memory,
a crash in native code): that job would be redelivered for ever. The worker counts the deaths and
fails the job after GROUNDED_MAX_WORKER_LOSSES of them. (A job whose *model* fails every attempt is
test_model_faults' poison case.)
"""

from __future__ import annotations

import pytest

from tests.reliability.conftest import endpoint_config, wait_for_running_job
from worker.tasks.process import WorkerLost

pytestmark = pytest.mark.slow

MAX_LOSSES = 2
POISON_KILLS = MAX_LOSSES


def test_poison_a_job_that_kills_its_worker_every_time_fails_after_max_losses(
    redis_space, fleet_for, faulty_openai
) -> None:
    fleet = fleet_for(redis_space, GROUNDED_MAX_WORKER_LOSSES=str(MAX_LOSSES))
    worker = fleet.start(pool="prefork", concurrency=2)
    lines = [{"custom_id": "poison", "question": "[delay] When does the observatory open? (poison)"}]
    lines += [{"custom_id": f"ok-{i}", "question": f"[delay] When does the observatory open? ({i})"} for i in range(4)]
    batch_id = fleet.submit(lines, endpoint_config(faulty_openai))
    [poison_id] = [j for j in fleet.store.job_ids(batch_id) if fleet.store.load_job(j).custom_id == "poison"]
    # the job "crashes" its pool child whenever it runs: the test kills that child
    while len(fleet.kills) < POISON_KILLS:
        task = wait_for_running_job(fleet, worker, child=True, job_id=poison_id)
        fleet.kill(task["worker_pid"], "prefork pool child running the poison job", poison_id)
    progress = fleet.wait(batch_id, timeout=60)
    results = {r.custom_id: r for r in fleet.store.iter_results(batch_id)}
    poison = results.pop("poison")
    assert poison.status == "failed" and poison.attempts == MAX_LOSSES + 1
    assert poison.error is not None and poison.error.type == WorkerLost.__name__
    assert poison.error.message == str(WorkerLost(MAX_LOSSES))
    assert poison.turns == []
    assert all(r.status == "succeeded" and r.attempts == 1 for r in results.values()) and len(results) == 4
    assert (progress.succeeded, progress.failed, progress.state) == (4, 1, "completed")
