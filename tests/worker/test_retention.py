"""H16: a batch and everything under it expire after the retention, or leave Redis at once when it is
deleted (the API, the CLI). Real Redis; real worker processes where a worker is involved.

"A key of the batch" is any key under the deployment's prefix whose name holds the id of the batch,
of one of its jobs, or of a conversation it started (which is that job's id), found by SCAN.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.conftest import TEST_TAG_KEY, RedisSpace, worker_env
from tests.worker.conftest import (
    FAKE_KEY,
    FAKE_KEY_ENV,
    PASSAGES,
    POLICY,
    Cluster,
    question_config,
    settings_for,
)
from tests.worker.fake_openai import FakeOpenAI
from worker.api.conversations import conversation_view
from worker.cli.main import cli
from worker.client import GroundedClient, NotFound
from worker.interfaces.openai_batch import OpenAIBatches
from worker.jobs.models import JobResult
from worker.producer import Producer
from worker.settings import DAY_S, get_settings
from worker.store.conversations import ConversationStore
from worker.store.deletion import delete_batch
from worker.store.keys import BATCH_KEY, FILE_KEY, OPENAI_BATCH_KEY, TENANT_BATCHES_KEY
from worker.store.results import ResultsStore

QUESTIONS = ["When does the observatory open?", "How large is the reflector mirror?", "Who painted the Mona Lisa?"]
LINES = [*({"custom_id": f"q{n}", "question": q} for n, q in enumerate(QUESTIONS)),
         {"custom_id": "talk", "turns": QUESTIONS[:2]}]


def keys_of(store: ResultsStore, batch_id: str, job_ids: list[str]) -> list[str]:
    """Every key under the prefix named after the batch, one of its jobs or a conversation it started."""
    marks = {batch_id.removeprefix("batch_")} | {job_id.removeprefix("job_") for job_id in job_ids}
    found = (key.decode() for key in store.redis.scan_iter(match=f"{store.prefix}*", count=1000))
    return sorted(key for key in found if any(mark in key for mark in marks))


def seconds(days: float) -> float:
    return days * DAY_S


def store_key(cluster: Cluster, template: str, batch_id: str) -> str:
    return cluster.store.key(template, batch_id=batch_id)


def test_H16a_delete_removes_every_key_of_the_batch_for_its_tenant_only(cluster: Cluster, api_url: str) -> None:
    with GroundedClient(api_url, "tok-acme") as acme, GroundedClient(api_url, "tok-globex") as globex:
        accepted = acme.submit(LINES, question_config(PASSAGES, POLICY))
        batch_id = accepted["id"]
        assert acme.wait(batch_id, timeout=60)["counts"]["succeeded"] == len(LINES)
        job_ids = cluster.store.job_ids(batch_id)
        before = keys_of(cluster.store, batch_id, job_ids)
        assert {key.removeprefix(cluster.space.prefix).split(":")[0] for key in before} == {
            "batch", "job", "result", "conversation"}
        assert acme.status(batch_id)["expires_at"] is not None

        with pytest.raises(NotFound):
            globex.delete(batch_id)
        assert keys_of(cluster.store, batch_id, job_ids) == before

        assert acme.delete(batch_id) == {"id": batch_id, "object": "batch", "deleted": True}
        assert keys_of(cluster.store, batch_id, job_ids) == []
        with pytest.raises(NotFound):
            acme.status(batch_id)
        assert batch_id not in {b["id"] for b in acme.batches()}
        assert cluster.store.redis.zscore(cluster.store.key(TENANT_BATCHES_KEY, tenant="acme"), batch_id) is None


def test_H16b_a_running_batch_deleted_leaves_nothing_and_its_queued_jobs_are_skipped(
    redis_space: RedisSpace, data_dir: Path, worker_process, fake_openai: FakeOpenAI
) -> None:
    worker = worker_process(worker_env(redis_space, data_dir, GROUNDED_CONCURRENCY="1", **{FAKE_KEY_ENV: FAKE_KEY}))
    producer = Producer(settings_for(redis_space, data_dir))
    config = question_config(PASSAGES, model="fake-model",
                             endpoint={"base_url": fake_openai.base_url, "api_key_env": FAKE_KEY_ENV})
    lines = [{"custom_id": "slow", "question": f"[slow:h14b] {QUESTIONS[0]}"},
             *({"custom_id": f"q{n}", "question": q} for n, q in enumerate(QUESTIONS))]
    report = producer.validate(lines, config)
    batch = producer.submit(report, tenant="tests")
    job_ids = producer.store.job_ids(batch.id)
    deadline = time.monotonic() + 30
    while not producer.store.progress_of(batch.id).running:
        assert time.monotonic() < deadline, worker.output()
        time.sleep(0.05)

    producer.delete(batch.id, "tests")
    deadline = time.monotonic() + 30
    while worker.output().count('"job_skipped"') < len(QUESTIONS) or '"job_finished"' not in worker.output():
        assert time.monotonic() < deadline, worker.output()
        time.sleep(0.1)
    assert keys_of(producer.store, batch.id, job_ids) == []
    assert "JobFailed" not in worker.output() and "JobMissing" not in worker.output()
    producer.app.close()


def test_H16c_writes_for_a_deleted_batch_delete_themselves(redis_space: RedisSpace, data_dir: Path) -> None:
    """What a job still running when its batch is deleted writes, through every write path."""
    producer = Producer(settings_for(redis_space, data_dir))
    store, conversations = producer.store, ConversationStore(producer.store)
    batch, jobs = store.create_batch(producer.validate(LINES, question_config(PASSAGES)), tenant="tests")
    job_ids = [job.id for job in jobs]
    talk = jobs[-1]
    assert delete_batch(store, batch.id, "tests") > 0

    store.begin_attempt(jobs[0])
    store.note_retry(jobs[0], delay_s=1.0, error="429")
    now = batch.created_at
    result = JobResult(job_id=jobs[0].id, batch_id=batch.id, custom_id="q0", kind="question", status="succeeded",
                       model="extractive", started_at=now, finished_at=now)
    assert store.write_result(result, total=batch.total)
    store.mark_cancelled(jobs[1], total=batch.total)
    store.request_cancel(batch.id)
    conversations.create(talk.id, tenant="tests", config=batch.config, job_id=talk.id, batch_id=batch.id)
    assert keys_of(store, batch.id, job_ids) == []
    producer.app.close()


def test_H16d_with_a_tiny_retention_the_keys_vanish_on_their_own_and_leave_the_listing(
    cluster: Cluster, data_dir: Path
) -> None:
    retention_s = 8
    producer = Producer(settings_for(cluster.space, data_dir, retention_days=retention_s / DAY_S),
                        app=cluster.producer.app)
    store = producer.store
    batch = producer.submit(producer.validate(LINES, question_config(PASSAGES)), tenant="brief")
    job_ids = store.job_ids(batch.id)
    cluster.wait(batch.id, timeout=retention_s)
    present = keys_of(store, batch.id, job_ids)
    assert any(key.startswith(f"{store.prefix}result:") for key in present)
    ttls = [store.redis.pttl(key) for key in present]
    assert all(0 < ttl <= retention_s * 1000 for ttl in ttls), dict(zip(present, ttls, strict=True))
    assert store.tenant_batches("brief") == [batch.id]

    deadline = time.monotonic() + retention_s + 10
    while keys_of(store, batch.id, job_ids):
        assert time.monotonic() < deadline, keys_of(store, batch.id, job_ids)
        time.sleep(0.5)
    assert store.tenant_batches("brief") == []
    assert store.redis.zcard(store.key(TENANT_BATCHES_KEY, tenant="brief")) == 0


def test_H16e_a_continued_conversation_outlives_the_batch_that_started_it(cluster: Cluster) -> None:
    producer, store = cluster.producer, cluster.store
    short = question_config(PASSAGES, retention_days=4 / DAY_S)
    first = producer.submit(producer.validate([{"custom_id": "talk", "turns": QUESTIONS[:1]}], short), tenant="tests")
    [conversation_id] = first_jobs = store.job_ids(first.id)
    cluster.wait(first.id)
    follow = producer.follow_up(conversation_id, QUESTIONS[1], tenant="tests", config=question_config(PASSAGES))
    cluster.wait(follow.batch_id)
    conversation_keys = [k for k in keys_of(store, first.id, first_jobs) if k.startswith(f"{store.prefix}conversation:")]
    assert conversation_keys and all(store.redis.pttl(k) > 29 * DAY_S * 1000 for k in conversation_keys)

    deadline = time.monotonic() + 15
    while store.redis.exists(store.key(BATCH_KEY, batch_id=first.id)):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert keys_of(store, first.id, first_jobs) == conversation_keys
    stored = producer.conversations.load(conversation_id)
    assert stored is not None and [t.job_id for t in stored.turns] == [conversation_id, follow.id]
    view = conversation_view(store, producer.conversations, stored.meta)
    assert [(t["kind"], t["question"], t["status"]) for t in view["turns"]] == [
        ("conversation", QUESTIONS[0], "succeeded"), ("follow_up", QUESTIONS[1], "succeeded")]
    assert store.load_result(follow.id) is not None


def test_H16f_a_batch_may_shorten_its_retention_but_not_lengthen_it(redis_space: RedisSpace, data_dir: Path) -> None:
    producer = Producer(settings_for(redis_space, data_dir, retention_days=10))
    refused = producer.validate(LINES, question_config(PASSAGES, retention_days=11))
    assert [(e.line_no, e.problem) for e in refused.errors] == [
        (0, "retention_days 11 is longer than this deployment keeps batches (GROUNDED_RETENTION_DAYS=10); "
            "a batch may only shorten it")]
    batch = producer.submit(producer.validate(LINES, question_config(PASSAGES, retention_days=7)), tenant="tests")
    assert batch.expires_at == batch.created_at + timedelta(days=7)
    assert seconds(7) - 60 < producer.store.redis.ttl(producer.store.key(BATCH_KEY, batch_id=batch.id)) <= seconds(7)
    default = producer.submit(producer.validate(LINES, question_config(PASSAGES)), tenant="tests")
    assert default.expires_at == default.created_at + timedelta(days=10)
    producer.app.close()


def test_H16g_grounded_delete_acts_as_its_tenant(cluster: Cluster, data_dir: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"REDIS_URL": cluster.space.url, "KEY_PREFIX": cluster.space.prefix,
                        "DATA_DIR": str(data_dir), "TAG_KEYS": TEST_TAG_KEY}.items():
        monkeypatch.setenv(f"GROUNDED_{name}", value)
    get_settings.cache_clear()
    try:
        batch = cluster.producer.submit(cluster.producer.validate(LINES[:1], question_config(PASSAGES)), tenant="acme")
        job_ids = cluster.store.job_ids(batch.id)
        runner = CliRunner()
        other = runner.invoke(cli, ["delete", batch.id, "--tenant", "globex"])
        assert other.exit_code == 1 and "not found" in other.output
        assert keys_of(cluster.store, batch.id, job_ids)
        done = runner.invoke(cli, ["delete", batch.id, "--tenant", "acme"])
        assert done.exit_code == 0 and f"batch {batch.id}: deleted" in done.output
        assert keys_of(cluster.store, batch.id, job_ids) == []
    finally:
        get_settings.cache_clear()


def test_H16h_openai_batch_records_and_files_go_with_their_batch(cluster: Cluster, data_dir: Path,
                                                                  tmp_path: Path) -> None:
    served = tmp_path / "handbook-qa.yaml"
    served.write_text(yaml.safe_dump(question_config(PASSAGES)))
    settings = settings_for(cluster.space, data_dir, configs={"handbook-qa": served})
    service = OpenAIBatches(Producer(settings, store=cluster.store, app=cluster.producer.app))
    lines = [{"custom_id": f"q{n}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "handbook-qa", "messages": [{"role": "user", "content": q}]}}
             for n, q in enumerate(QUESTIONS)]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    upload = service.upload("acme", filename="in.jsonl", purpose="batch", content=content)
    created = service.create("acme", input_file_id=upload["id"], endpoint="/v1/chat/completions",
                             completion_window="24h", metadata=None)
    cluster.wait(created["id"])
    output_file = service.retrieve("acme", created["id"])["output_file_id"]
    job_ids = cluster.store.job_ids(created["id"])
    present = keys_of(cluster.store, created["id"], job_ids)
    assert any(output_file in key for key in present)
    assert store_key(cluster, OPENAI_BATCH_KEY, created["id"]) in present
    batch_ttl = cluster.store.redis.pttl(cluster.store.key(BATCH_KEY, batch_id=created["id"]))
    assert all(batch_ttl - 60_000 < cluster.store.redis.pttl(key) <= batch_ttl + 1000 for key in present)

    unknown = [{**lines[0], "body": {**lines[0]["body"], "model": "no-such-config"}}]
    upload = service.upload("acme", filename="bad.jsonl", purpose="batch", content=json.dumps(unknown[0]).encode())
    refused = service.create("acme", input_file_id=upload["id"], endpoint="/v1/chat/completions",
                             completion_window="24h", metadata=None)
    assert refused["status"] == "failed"  # refused, with no grounded batch: kept for the deployment's retention
    refused_ttl = cluster.store.redis.ttl(store_key(cluster, OPENAI_BATCH_KEY, refused["id"]))
    assert seconds(30) - 60 < refused_ttl <= seconds(30)
    assert cluster.store.redis.ttl(cluster.store.key(FILE_KEY, file_id=refused["error_file_id"])) <= refused_ttl
    cluster.producer.delete(created["id"], "acme")
    assert keys_of(cluster.store, created["id"], job_ids) == []
    assert created["id"] not in [b["id"] for b in service.page("acme", after=None, limit=100)["data"]]
