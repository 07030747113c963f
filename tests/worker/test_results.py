"""The results store against a real Redis: idempotent writes, counters, events, compression."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import redis

from tests.conftest import RedisSpace
from worker.jobs.lines import parse_batch
from worker.jobs.models import JobResult
from worker.store import results
from worker.store.keys import RESULT_KEY
from worker.store.results import ResultsStore

CONFIG = {"agent": {"model": "extractive"}}


def stored_batch(store: ResultsStore, n: int = 2):
    report = parse_batch([{"custom_id": f"c{i}", "question": f"q{i}?"} for i in range(n)], CONFIG)
    return store.create_batch(report, tenant="acme")


def result_for(job, *, status: str = "succeeded", answer: str = "a", attempts: int = 1) -> JobResult:
    now = datetime.now(UTC)
    return JobResult(job_id=job.id, batch_id=job.batch_id, custom_id=job.custom_id, kind="question",
                     status=status, model="extractive", attempts=attempts, started_at=now, finished_at=now,
                     metadata={"answer": answer})


def events(store: ResultsStore, batch_id: str) -> list[str]:
    return [fields["event"] for _, fields in store.events(batch_id)]


def test_H10_redelivered_job_is_counted_once(redis_space: RedisSpace) -> None:
    store = redis_space.store()
    batch, (first, second) = stored_batch(store)
    assert store.write_result(result_for(first, status="failed"), total=batch.total) is True
    assert store.write_result(result_for(first, answer="again", attempts=2), total=batch.total) is False
    progress = store.progress(batch.id)
    assert (progress.succeeded, progress.failed, progress.done, progress.queued) == (1, 0, 1, 1)
    assert store.load_result(first.id).metadata == {"answer": "again"}
    assert events(store, batch.id).count("job_finished") == 1
    store.write_result(result_for(second), total=batch.total)
    store.write_result(result_for(second), total=batch.total)
    assert events(store, batch.id).count("batch_finished") == 1
    assert store.progress(batch.id).state == "completed"


def test_partial_results_are_readable_in_submission_order(redis_space: RedisSpace) -> None:
    store = redis_space.store()
    batch, jobs = stored_batch(store, n=3)
    store.write_result(result_for(jobs[2]), total=batch.total)
    assert [r.custom_id for r in store.iter_results(batch.id)] == ["c2"]
    store.write_result(result_for(jobs[0]), total=batch.total)
    assert [r.custom_id for r in store.iter_results(batch.id)] == ["c0", "c2"]
    assert store.job_state(jobs[1]) == "queued" and store.job_state(jobs[2]) == "succeeded"


def test_large_results_are_stored_compressed(redis_space: RedisSpace) -> None:
    store = ResultsStore.from_url(redis_space.url, prefix=redis_space.prefix, compress_over=100)
    batch, (job, _) = stored_batch(store)
    result = result_for(job, answer="x" * 5000)
    store.write_result(result, total=batch.total)
    raw = store.redis.get(store.key(RESULT_KEY, job_id=job.id))
    assert raw.startswith(b"z:") and len(raw) < 1000
    assert store.load_result(job.id) == result


def test_a_cancelled_job_that_already_finished_is_not_counted_twice(redis_space: RedisSpace) -> None:
    store = redis_space.store()
    batch, (job, other) = stored_batch(store)
    store.write_result(result_for(job), total=batch.total)
    assert store.mark_cancelled(job, total=batch.total) is False
    assert store.mark_cancelled(other, total=batch.total) is True
    progress = store.progress(batch.id)
    assert (progress.succeeded, progress.cancelled, progress.finished) == (1, 1, True)


def test_attempts_count_every_start(redis_space: RedisSpace) -> None:
    store = redis_space.store()
    _, (job, _) = stored_batch(store)
    assert [store.begin_attempt(job).number, store.begin_attempt(job).number] == [1, 2]
    assert store.job_state(job) == "running"


def test_a_task_reads_its_job_batch_and_cancel_flag_in_one_round_trip(redis_space: RedisSpace) -> None:
    store = redis_space.store()
    batch, (job, _) = stored_batch(store)
    assert store.load_run(job.id) == (job, batch, False)
    store.request_cancel(batch.id)
    loaded_job, loaded_batch, cancelled = store.load_run(job.id)
    assert (loaded_job, loaded_batch, cancelled) == (job, batch, True)
    assert loaded_batch is store.load_batch(batch.id)  # parsed once per process while its bytes stay the same
    assert store.load_run("job_missing") == (None, None, False)


def test_H10_the_write_that_counts_a_job_adds_its_metrics_once(redis_space: RedisSpace) -> None:
    from worker.store.keys import METRICS_KEY

    store = redis_space.store()
    batch, (job, other) = stored_batch(store)
    counts = {"jobs:succeeded:question": 1, "job:sum": 0.25}
    assert store.write_result(result_for(job), total=batch.total, metrics=counts) is True
    assert store.write_result(result_for(job), total=batch.total, metrics=counts) is False
    assert store.mark_cancelled(other, total=batch.total, metrics={"jobs:cancelled:question": 1}) is True
    stored = {k.decode(): float(v) for k, v in store.redis.hgetall(store.key(METRICS_KEY)).items()}
    assert stored == {"jobs:succeeded:question": 1.0, "job:sum": 0.25, "jobs:cancelled:question": 1.0}


def test_wait_finished_wakes_when_the_last_job_finishes_and_not_before(redis_space: RedisSpace) -> None:
    store = redis_space.store()
    batch, (first, second) = stored_batch(store)
    assert store.wait_finished(batch.id, 0.05) is False  # nothing finished: waits out its time

    def finish() -> None:
        time.sleep(0.1)
        store.write_result(result_for(first), total=batch.total)  # an event that is not the end
        time.sleep(0.2)
        store.write_result(result_for(second), total=batch.total)

    finisher = threading.Thread(target=finish)
    start = time.monotonic()
    finisher.start()
    assert store.wait_finished(batch.id, 10) is True
    waited = time.monotonic() - start
    finisher.join()
    assert 0.3 <= waited < 2, waited
    assert store.wait_finished(batch.id, 10) is True  # already finished: at once


def test_wait_finished_on_a_deleted_or_unknown_batch_waits_out_its_time(redis_space: RedisSpace) -> None:
    start = time.monotonic()
    assert redis_space.store().wait_finished("no-such-batch", 0.1) is False
    assert 0.1 <= time.monotonic() - start < 1


def test_wait_finished_outlasts_the_clients_socket_timeout(redis_space: RedisSpace, monkeypatch) -> None:
    """redis-py times a blocked read out like any other (5 s by default), so a long wait blocks in
    shorter reads; here a 0.5 s socket timeout against a 1.2 s wait."""
    monkeypatch.setattr(results, "WAIT_BLOCK_S", 0.2)
    store = ResultsStore(redis.Redis.from_url(redis_space.url, socket_timeout=0.5), prefix=redis_space.prefix)
    batch, _ = stored_batch(store)
    start = time.monotonic()
    assert store.wait_finished(batch.id, 1.2) is False
    assert time.monotonic() - start >= 1.2


def test_a_followed_batch_is_seen_finished_as_it_finishes_not_at_the_next_redraw(redis_space: RedisSpace) -> None:
    from rich.console import Console

    from worker.cli.following import follow_batch

    store = redis_space.store()
    batch, jobs = stored_batch(store, n=1)
    finisher = threading.Timer(0.2, lambda: store.write_result(result_for(jobs[0]), total=batch.total))
    start = time.monotonic()
    finisher.start()
    progress = follow_batch(store, batch.id, Console(quiet=True), timeout=30, interval_s=10)
    assert progress.finished and time.monotonic() - start < 2
