"""H18: a job whose message the broker lost (taken by BRPOP, never recorded as unacknowledged) is
found by a sweep and sent again; a job merely passing through that gap is not."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.conftest import worker_env
from tests.worker.conftest import PASSAGES, question_config, settings_for
from worker.producer import Producer
from worker.store.broker_messages import message_job_id
from worker.store.keys import ACTIVE_BATCHES_KEY, BATCH_FINISHED_KEY
from worker.store.orphans import OrphanStore, confirmed_orphans

QUEUED = json.dumps({"body": "W10=", "headers": {"id": "job_a", "task": "grounded.answer_job"}, "properties": {}})
UNACKED = json.dumps([json.loads(QUEUED) | {"headers": {"id": "job_b"}}, "", "jobs"])


def test_H18_a_message_names_its_job_on_the_queue_and_unacknowledged() -> None:
    assert message_job_id(QUEUED) == "job_a"
    assert message_job_id(UNACKED.encode()) == "job_b"
    assert message_job_id(b"not json") is None and message_job_id("{}") is None


def test_H18_a_job_missing_once_is_not_resent_yet() -> None:
    resend, seen = confirmed_orphans(["job_a"], {}, now=100.0, grace_s=30)
    assert resend == [] and seen == {"job_a": 100.0}


def test_H18_a_job_still_missing_after_the_grace_is_resent() -> None:
    resend, seen = confirmed_orphans(["job_a", "job_b"], {"job_a": 60.0, "job_b": 90.0}, now=100.0, grace_s=30)
    assert resend == ["job_a"] and seen == {"job_a": 60.0, "job_b": 90.0}


def test_H18_a_job_found_again_is_forgotten() -> None:
    resend, seen = confirmed_orphans([], {"job_a": 10.0}, now=100.0, grace_s=30)
    assert resend == [] and seen == {}


def test_H18_only_open_batches_jobs_without_a_message_are_missing(redis_space, data_dir: Path) -> None:
    producer = Producer(settings_for(redis_space, data_dir))
    try:
        report = producer.validate([{"custom_id": f"q{i}", "question": "When does it open?"} for i in range(3)],
                                   question_config(PASSAGES))
        batch, jobs = producer.store.create_batch(report, tenant="tests")  # stored, never sent: as if lost
        orphans = OrphanStore(producer.store)
        assert orphans.delivered_jobs() == set()
        assert orphans.unfinished_jobs() == {job.id: batch.id for job in jobs}
        producer.store.redis.set(producer.store.key(BATCH_FINISHED_KEY, batch_id=batch.id), "x")
        assert orphans.unfinished_jobs() == {}  # a finished batch leaves the open set
        assert not producer.store.redis.sismember(producer.store.key(ACTIVE_BATCHES_KEY), batch.id)
    finally:
        producer.app.close()


def test_H18_a_batch_whose_messages_were_lost_finishes_once_they_are_resent(
    redis_space, data_dir: Path, worker_process
) -> None:
    """The batch is stored and one of its jobs is sent; the others' messages are lost (never on the
    queue, never unacknowledged). The sweep re-sends them, and each job is counted once."""
    producer = Producer(settings_for(redis_space, data_dir))
    try:
        report = producer.validate([{"custom_id": f"q{i}", "question": "When does the observatory open?"}
                                    for i in range(3)], question_config(PASSAGES))
        batch, jobs = producer.store.create_batch(report, tenant="tests")
        producer._enqueue(jobs[:1])
        worker = worker_process(worker_env(redis_space, data_dir, GROUNDED_ORPHAN_SWEEP_S="1"))
        deadline = time.monotonic() + 60
        while not (progress := producer.store.progress_of(batch.id)).finished:
            assert time.monotonic() < deadline, (progress, worker.output()[-3000:])
            time.sleep(0.2)
        assert (progress.succeeded, progress.failed) == (3, 0)
        assert sorted(r.attempts for r in producer.store.iter_results(batch.id)) == [1, 1, 1]
        resent = [json.loads(line)["job_id"] for line in worker.output().splitlines()
                  if line.startswith("{") and json.loads(line).get("event") == "job_resent"]
        assert sorted(resent) == sorted(job.id for job in jobs[1:])
    finally:
        producer.app.close()
