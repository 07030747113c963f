"""Integration: real worker processes, real Redis, the real results store."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import worker_env
from tests.worker.conftest import (
    FAKE_KEY,
    FAKE_KEY_ENV,
    MISSING_KEY_ENV,
    PASSAGES,
    POLICY,
    Cluster,
    question_config,
    settings_for,
)
from tests.worker.fake_openai import FAKE_ANSWER, FakeOpenAI
from worker.producer import Producer
from worker.runtime.extractive import NOT_FOUND


def test_batch_of_questions_with_policy_has_expected_statuses_and_citations(cluster: Cluster) -> None:
    lines = [
        {"custom_id": "hours", "question": "When does the observatory open?", "metadata": {"answerable": True}},
        {"custom_id": "france", "question": "What is the capital of France?", "metadata": {"answerable": False}},
    ]
    batch_id = cluster.submit(lines, question_config(PASSAGES, POLICY))
    progress = cluster.wait(batch_id)
    assert (progress.succeeded, progress.failed, progress.state) == (2, 0, "completed")

    results = {r.custom_id: r for r in cluster.store.iter_results(batch_id)}
    hours, france = results["hours"].turns[0], results["france"].turns[0]
    assert results["hours"].model == "extractive" and results["hours"].policy_registered
    assert hours.citation_status == "grounded"
    assert [c.chunk_id for c in hours.cited] == [r["chunk_id"] for r in hours.declared_refs]
    assert "19:00" in hours.cited[0].content and hours.cited[0].retrieved_this_question
    assert "19:00" in hours.answer
    assert (hours.redirects, hours.violation) == (0, False)
    assert france.citation_status == "ungrounded" and france.cited == [] and france.answer == NOT_FOUND
    assert results["france"].metadata == {"answerable": False}
    assert results["france"].state_after["citation_policy"] == {"violations": []}


def test_unknown_corpus_fails_the_job_on_the_worker_naming_the_known_ones(cluster: Cluster, tmp_path: Path) -> None:
    """A producer that cannot see the corpora lets the name through; the worker refuses it."""
    blind = Producer(settings_for(cluster.space, tmp_path), store=cluster.store, app=cluster.producer.app)
    report = blind.validate([{"custom_id": "a", "question": "q?"}],
                            question_config({"PassageSearchCapability": {"corpus": "atlas"}}))
    assert report.ok
    batch = blind.submit(report, tenant="tests")
    progress = cluster.wait(batch.id)
    assert (progress.failed, progress.succeeded) == (1, 0)
    [result] = cluster.store.iter_results(batch.id)
    assert result.error is not None and result.error.type == "CompositionError"
    assert "'atlas' is not served here; known: handbook" in result.error.message
    assert result.attempts == 1


def test_missing_api_key_env_var_fails_at_once_with_its_name(cluster: Cluster, fake_openai: FakeOpenAI) -> None:
    config = question_config(PASSAGES, model="fake-model",
                             endpoint={"base_url": fake_openai.base_url, "api_key_env": MISSING_KEY_ENV})
    batch_id = cluster.submit([{"custom_id": "k", "question": "When does the observatory open?"}], config)
    progress = cluster.wait(batch_id)
    [result] = cluster.store.iter_results(batch_id)
    assert progress.failed == 1 and result.status == "failed"
    assert result.error is not None and result.error.type == "ModelUnavailable"
    assert MISSING_KEY_ENV in result.error.message and "not set" in result.error.message
    assert result.attempts == 1 and result.model == "openai-compatible:fake-model"


@pytest.mark.parametrize(
    ("key_env", "host", "refusal"),
    [("PATH", "127.0.0.1", "is not bound to an endpoint"), (FAKE_KEY_ENV, "localhost", "may be sent only to")],
    ids=["unbound-variable", "url-outside-its-binding"],
)
def test_an_endpoint_key_is_sent_only_where_the_worker_bound_it(
    cluster: Cluster, fake_openai: FakeOpenAI, key_env: str, host: str, refusal: str
) -> None:
    """The job chooses base_url, so a key variable it names is read only when
    GROUNDED_ENDPOINT_KEY_BINDINGS binds it to a matching URL; otherwise a token holder could
    collect the worker's keys."""
    seen = len(fake_openai.requests)
    config = question_config(PASSAGES, model="fake-model", endpoint={
        "base_url": fake_openai.base_url.replace("127.0.0.1", host), "api_key_env": key_env})
    batch_id = cluster.submit([{"custom_id": "x", "question": "When does the observatory open?"}], config)
    progress = cluster.wait(batch_id)
    [result] = cluster.store.iter_results(batch_id)
    assert progress.failed == 1 and result.error is not None and result.error.type == "ModelUnavailable"
    assert refusal in result.error.message and key_env in result.error.message and result.attempts == 1
    assert len(fake_openai.requests) == seen, "the model server must never be called with an unbound key"


def test_H6_job_answered_after_429_twice_is_counted_once(cluster: Cluster, fake_openai: FakeOpenAI) -> None:
    """Two 429s with Retry-After, then success: one result, counted once, three attempts, one question."""
    config = question_config(PASSAGES, POLICY, model="fake-model",
                             endpoint={"base_url": fake_openai.base_url, "api_key_env": FAKE_KEY_ENV})
    batch_id = cluster.submit([{"custom_id": "f", "question": "[flaky:h6a] When does the observatory open?"}], config)
    progress = cluster.wait(batch_id)
    assert (progress.succeeded, progress.failed, progress.done) == (1, 0, 1)
    [result] = cluster.store.iter_results(batch_id)
    turn = result.turns[0]
    assert result.attempts == 3
    assert (turn.answer, turn.citation_status, turn.question_identity) == (FAKE_ANSWER, "grounded", 0)
    events = [fields["event"] for _, fields in cluster.store.events(batch_id)]
    assert events.count("job_finished") == 1 and events.count("job_retrying") == 2
    requests = fake_openai.requests_for("[flaky:h6a]")
    assert {r["authorization"] for r in requests} == {f"Bearer {FAKE_KEY}"}


def test_H6_transport_error_then_success_gives_one_question_in_history(
    cluster: Cluster, fake_openai: FakeOpenAI
) -> None:
    """H6/H7: a 503 on the first attempt; the retry re-runs the question from scratch, with the
    identity of a single run, and nothing of the failed attempt is kept."""
    config = question_config(PASSAGES, model="fake-model",
                             endpoint={"base_url": fake_openai.base_url, "api_key_env": FAKE_KEY_ENV})
    batch_id = cluster.submit([{"custom_id": "d", "question": "[down:h6b] When does the observatory open?"}], config)
    cluster.wait(batch_id)
    [result] = cluster.store.iter_results(batch_id)
    assert result.status == "succeeded" and result.attempts == 2
    turn = result.turns[0]
    assert turn.question_identity == 0 and result.state_after["passages"]["evidence"]["question"] == 0
    from pydantic_ai.messages import ModelMessagesTypeAdapter, UserPromptPart

    messages = ModelMessagesTypeAdapter.validate_json(turn.new_messages_json)
    prompts = [p for m in messages for p in m.parts if isinstance(p, UserPromptPart)]
    assert len(prompts) == 1


def test_H10_policy_redirect_through_the_openai_client_is_counted(cluster: Cluster, fake_openai: FakeOpenAI) -> None:
    """P4(c) as a question job: uncited, redirected once, cites c-1 style (first chunk), answers."""
    config = question_config(PASSAGES, POLICY, model="fake-model",
                             endpoint={"base_url": fake_openai.base_url, "api_key_env": FAKE_KEY_ENV})
    batch_id = cluster.submit([{"custom_id": "r", "question": "[uncited] When does the observatory open?"}], config)
    cluster.wait(batch_id)
    [result] = cluster.store.iter_results(batch_id)
    turn = result.turns[0]
    assert (turn.citation_status, turn.redirects, turn.violation) == ("grounded", 1, False)
    assert turn.cited[0].chunk_id == turn.declared_refs[0]["chunk_id"]
    assert turn.n_requests == 4 and turn.tool_calls == {"passages_search": 1, "passages_cite": 1}
    assert len(turn.wire) == 4


def test_H2_policy_not_listed_leaves_no_policy_state(cluster: Cluster) -> None:
    batch_id = cluster.submit([{"custom_id": "p", "question": "When does the observatory open?"}],
                              question_config(PASSAGES))
    cluster.wait(batch_id)
    [result] = cluster.store.iter_results(batch_id)
    assert result.policy_registered is False
    assert "citation_policy" not in result.state_after
    assert result.turns[0].violation is False and result.turns[0].citation_status == "grounded"


def test_cancel_stops_queued_jobs_before_they_run(redis_space, data_dir: Path, worker_process) -> None:
    producer = Producer(settings_for(redis_space, data_dir))
    cluster = Cluster(redis_space, None, producer)
    lines = [{"custom_id": f"q{i}", "question": "When does the observatory open?"} for i in range(20)]
    batch_id = cluster.submit(lines, question_config(PASSAGES))
    producer.cancel(batch_id)
    cluster.worker = worker_process(worker_env(redis_space, data_dir))
    progress = cluster.wait(batch_id, timeout=20)
    assert (progress.cancelled, progress.done, progress.state) == (20, 0, "cancelled")
    assert list(cluster.store.iter_results(batch_id)) == []
    producer.app.close()


def test_H8_worker_refuses_to_start_without_tag_keys(redis_space, data_dir: Path, worker_process) -> None:
    worker = worker_process(worker_env(redis_space, data_dir, GROUNDED_TAG_KEYS=None), wait=False)
    assert worker.process.wait(timeout=60) != 0
    assert "GROUNDED_TAG_KEYS is not set" in worker.output()


def test_H11_conversation_turns_share_one_state_and_history(cluster: Cluster) -> None:
    """A conversation job runs its turns in order in one task, carrying deps.state and history;
    the compactor is registered because the config lists it and the job has several turns (H1)."""
    config = question_config(PASSAGES, POLICY, "EvidenceCompactionCapability")
    turns = ["When does the observatory open?", "How large is the reflector mirror?"]
    batch_id = cluster.submit([{"custom_id": "conv", "turns": turns}], config)
    cluster.wait(batch_id)
    [result] = cluster.store.iter_results(batch_id)
    assert result.status == "succeeded" and result.kind == "conversation"
    assert result.compactor_registered and result.policy_registered
    first, second = result.turns
    assert first.question_identity == 0 and second.question_identity == 2 * first.n_requests
    assert [t.citation_status for t in result.turns] == ["grounded", "grounded"]
    assert "400 mm" in second.answer
    occurrences = result.state_after["passages"]["evidence"]["occurrences"]
    assert {q for o in occurrences.values() for q in o["cited_in_questions"]} == {0, second.question_identity}


@pytest.mark.slow
def test_H10_job_redelivered_after_its_worker_is_killed_is_counted_once(
    redis_space, data_dir: Path, worker_process, fake_openai: FakeOpenAI
) -> None:
    """kill -9 a worker mid-job: acks_late leaves the job unacked, its lease expires (H14) and it goes
    to another worker, and the job is counted once with two attempts."""
    env = worker_env(redis_space, data_dir, **{FAKE_KEY_ENV: FAKE_KEY}, GROUNDED_TASK_SOFT_LIMIT_S="60",
                     GROUNDED_TASK_HARD_LIMIT_S="60", GROUNDED_RETRY_MAX_S="1")
    producer = Producer(settings_for(redis_space, data_dir))
    cluster = Cluster(redis_space, worker_process(env), producer)
    config = question_config(PASSAGES, model="fake-model",
                             endpoint={"base_url": fake_openai.base_url, "api_key_env": FAKE_KEY_ENV})
    batch_id = cluster.submit([{"custom_id": "k", "question": "[slow:kill1] When does the observatory open?"}], config)
    deadline = time.monotonic() + 20
    while not fake_openai.requests_for("[slow:kill1]"):
        assert time.monotonic() < deadline, cluster.worker.output()
        time.sleep(0.05)
    cluster.worker.kill()
    cluster.worker = worker_process(env)
    progress = cluster.wait(batch_id, timeout=60)
    [result] = cluster.store.iter_results(batch_id)
    assert (progress.succeeded, progress.done, result.attempts) == (1, 1, 2)
    events = [fields["event"] for _, fields in cluster.store.events(batch_id)]
    assert (events.count("job_started"), events.count("job_finished")) == (2, 1)
    producer.app.close()


def test_a_job_past_its_timeout_fails_with_nothing_committed(cluster: Cluster, fake_openai: FakeOpenAI) -> None:
    config = question_config(PASSAGES, model="fake-model", run={"timeout_s": 1, "retries": 3},
                             endpoint={"base_url": fake_openai.base_url, "api_key_env": FAKE_KEY_ENV})
    batch_id = cluster.submit([{"custom_id": "t", "question": "[slow:timeout1] When does it open?"}], config)
    cluster.wait(batch_id, timeout=20)
    [result] = cluster.store.iter_results(batch_id)
    assert result.status == "failed" and result.error.type == "TimeoutError"
    assert "did not finish within 1 s" in result.error.message
    assert (result.turns, result.state_after, result.attempts) == ([], {}, 1)
