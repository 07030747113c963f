"""GET /metrics: queue depth, oldest-job age, jobs by status, redirects, violations, model latency
and tokens, all read from Redis, so every API replica reports what every worker did."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic_ai.messages import (
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)

from tests.conftest import RedisSpace, worker_env
from tests.worker.conftest import (
    FAKE_KEY,
    FAKE_KEY_ENV,
    PASSAGES,
    POLICY,
    Cluster,
    question_config,
    serve,
    settings_for,
)
from tests.worker.fake_openai import FakeOpenAI
from worker.api.app import create_api
from worker.api.metrics import registry_for
from worker.jobs.models import JobResult, TurnResult, Usage
from worker.producer import Producer
from worker.store.keys import QUEUE
from worker.store.metrics import (
    CITATION_STATUSES,
    DIRECTIONS,
    FINISHED,
    KINDS,
    JobObservation,
    increments,
    observe,
    record_finished,
    request_latencies,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(metrics: Samples, name: str, **labels: str) -> float:
    return metrics[(name, tuple(sorted(labels.items())))]


def scrape_store(space: RedisSpace) -> Samples:
    from prometheus_client import generate_latest

    return samples(generate_latest(registry_for(space.store())).decode())


def exchange(sent: datetime, seconds: float, text: str = "ok") -> list:
    return [ModelRequest(parts=[UserPromptPart("q")], timestamp=sent),
            ModelResponse(parts=[TextPart(text)], timestamp=sent + timedelta(seconds=seconds))]


def result_with(turns: list[TurnResult], *, job_id: str = "job_1", status: str = "succeeded",
                seconds: float = 3.0) -> JobResult:
    return JobResult(job_id=job_id, batch_id="batch_1", custom_id=f"custom-{job_id}", kind="question",
                     status=status, model="extractive", turns=turns, started_at=T0,  # type: ignore[arg-type]
                     finished_at=T0 + timedelta(seconds=seconds))


def turn(messages: list, *, redirects: int = 0, violation: bool = False, n_requests: int = 1,
         tokens: tuple[int, int] = (0, 0), citation_status: str = "grounded") -> TurnResult:
    return TurnResult(question_identity=0, question_text="q", answer="a",
                      citation_status=citation_status,  # type: ignore[arg-type]
                      redirects=redirects, violation=violation, n_requests=n_requests,
                      usage=Usage(input_tokens=tokens[0], output_tokens=tokens[1]),
                      new_messages_json=ModelMessagesTypeAdapter.dump_json(messages))


def test_model_request_latency_is_response_time_minus_request_time() -> None:
    messages = exchange(T0, 1.5) + exchange(T0 + timedelta(seconds=2), 0.25)
    assert request_latencies(messages) == [1.5, 0.25]


def test_a_finished_job_adds_status_redirects_violations_tokens_and_latencies() -> None:
    result = result_with([
        turn(exchange(T0, 0.3) + exchange(T0 + timedelta(seconds=1), 7.0), redirects=1, violation=True,
             n_requests=2, tokens=(40, 9)),
        turn(exchange(T0 + timedelta(seconds=9), 200.0), n_requests=1, tokens=(10, 1), citation_status="ungrounded"),
    ], seconds=250.0)
    observation = observe(result)
    assert observation == JobObservation(status="succeeded", kind="question",
                                         citation_statuses=("grounded", "ungrounded"), redirects=1, violations=1,
                                         model_requests=3, input_tokens=50, output_tokens=10,
                                         request_seconds=(0.3, 7.0, 200.0), job_seconds=250.0)
    assert increments(observation) == {
        "jobs:succeeded:question": 1, "answers:grounded": 1, "answers:ungrounded": 1,
        "redirects": 1, "violations": 1, "model_requests": 3,
        "tokens:input": 50, "tokens:output": 10,
        "model_request:le:0.5": 1, "model_request:le:10": 1,   # 200 s is above the last bound
        "model_request:count": 3, "model_request:sum": 207.3,
        "job:le:300": 1, "job:count": 1, "job:sum": 250.0,
    }


def test_scrape_reports_recorded_jobs_as_counters_and_histograms(redis_space: RedisSpace) -> None:
    store = redis_space.store()
    record_finished(store, result_with([turn(exchange(T0, 0.3), redirects=2, tokens=(11, 7))], job_id="a"))
    record_finished(store, result_with([turn(exchange(T0, 4.0), violation=True, tokens=(5, 1))], job_id="b",
                                       status="failed"))
    metrics = scrape_store(redis_space)
    assert value(metrics, "grounded_jobs_finished_total", status="succeeded", kind="question") == 1
    assert value(metrics, "grounded_jobs_finished_total", status="failed", kind="question") == 1
    assert value(metrics, "grounded_redirects_total") == 2
    assert value(metrics, "grounded_policy_violations_total") == 1
    assert value(metrics, "grounded_model_tokens_total", direction="input") == 16
    assert value(metrics, "grounded_model_tokens_total", direction="output") == 8
    assert value(metrics, "grounded_model_request_duration_seconds_bucket", le="0.5") == 1
    assert value(metrics, "grounded_model_request_duration_seconds_bucket", le="5.0") == 2
    assert value(metrics, "grounded_model_request_duration_seconds_count") == 2
    assert value(metrics, "grounded_model_request_duration_seconds_sum") == pytest.approx(4.3)


def test_answers_are_counted_by_citation_status_once_per_answered_question(redis_space: RedisSpace) -> None:
    """The operations guide's citation-status dashboard: one count per turn, whatever the job's status."""
    store = redis_space.store()
    record_finished(store, result_with([turn(exchange(T0, 1.0)), turn(exchange(T0, 1.0), citation_status="missing")],
                                       job_id="conversation"))
    record_finished(store, result_with([turn(exchange(T0, 1.0), citation_status="ungrounded")], job_id="failed",
                                       status="failed"))
    metrics = scrape_store(redis_space)
    assert {s: value(metrics, "grounded_answers_total", citation_status=s) for s in CITATION_STATUSES} == {
        "grounded": 1, "ungrounded": 1, "missing": 1}


def test_labels_are_bounded_sets_whatever_the_jobs(redis_space: RedisSpace) -> None:
    """No job id, batch id or custom_id becomes a label: more jobs move values, never add series."""
    store = redis_space.store()
    record_finished(store, result_with([turn(exchange(T0, 1.0))], job_id="first"))
    before = set(scrape_store(redis_space))
    ids = [f"job_{i}" for i in range(12)]
    for job_id in ids:
        record_finished(store, result_with([turn(exchange(T0, 1.0))], job_id=job_id))
    after = scrape_store(redis_space)
    assert set(after) == before
    allowed = {"queue": {QUEUE}, "status": set(FINISHED), "kind": set(KINDS), "direction": set(DIRECTIONS),
               "citation_status": set(CITATION_STATUSES)}
    for _, labels in after:
        for label, label_value in labels:
            assert label == "le" or label_value in allowed[label], (label, label_value)
    assert value(after, "grounded_jobs_finished_total", status="succeeded", kind="question") == 13


@pytest.fixture
def metrics_api(redis_space: RedisSpace, data_dir: Path) -> Iterator[tuple[str, Producer]]:
    """The real API (create_api, so the route is the one it includes) on 127.0.0.1, no worker yet."""
    settings = settings_for(redis_space, data_dir, api_tokens={"tok": "acme"})
    producer = Producer(settings)
    with serve(create_api(settings, producer=producer)) as url:
        yield url, producer
    producer.app.close()


def scrape(url: str) -> Samples:
    response = httpx2.get(f"{url}/metrics", timeout=10)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return samples(response.text)


def test_queue_depth_and_oldest_job_age_follow_jobs_queued_then_run(
    metrics_api: tuple[str, Producer], redis_space: RedisSpace, data_dir: Path, worker_process,
    fake_openai: FakeOpenAI,
) -> None:
    url, producer = metrics_api
    cluster = Cluster(redis_space, None, producer)
    config = question_config(PASSAGES, POLICY, model="fake-model",
                             endpoint={"base_url": fake_openai.base_url, "api_key_env": FAKE_KEY_ENV})
    lines = [{"custom_id": f"m{i}", "question": f"[uncited] When does the observatory open? ({i})"} for i in range(3)]
    empty = scrape(url)
    assert value(empty, "grounded_queue_depth", queue=QUEUE) == 0
    assert value(empty, "grounded_queue_oldest_job_age_seconds", queue=QUEUE) == 0

    batch_id = cluster.submit(lines, config)
    queued = scrape(url)
    time.sleep(1.1)
    waiting = scrape(url)
    assert value(queued, "grounded_queue_depth", queue=QUEUE) == value(waiting, "grounded_queue_depth", queue=QUEUE) == 3
    first_age = value(queued, "grounded_queue_oldest_job_age_seconds", queue=QUEUE)
    assert 0 <= first_age < 30
    assert value(waiting, "grounded_queue_oldest_job_age_seconds", queue=QUEUE) >= first_age + 1.0
    assert value(waiting, "grounded_jobs_finished_total", status="succeeded", kind="question") == 0

    worker_process(worker_env(redis_space, data_dir, **{FAKE_KEY_ENV: FAKE_KEY}))
    progress = cluster.wait(batch_id)
    assert progress.succeeded == 3
    deadline = time.monotonic() + 10
    while value(done := scrape(url), "grounded_jobs_reserved") and time.monotonic() < deadline:
        time.sleep(0.05)  # a job's delivery is acknowledged a moment after its result is written
    assert value(done, "grounded_queue_depth", queue=QUEUE) == 0
    assert value(done, "grounded_queue_oldest_job_age_seconds", queue=QUEUE) == 0
    assert value(done, "grounded_jobs_reserved") == 0
    assert value(done, "grounded_jobs_finished_total", status="succeeded", kind="question") == 3
    assert value(done, "grounded_answers_total", citation_status="grounded") == 3   # each cites after a redirect
    assert value(done, "grounded_answers_total", citation_status="ungrounded") == 0
    assert value(done, "grounded_redirects_total") == 3            # [uncited]: one redirect per job
    assert value(done, "grounded_policy_violations_total") == 0
    assert value(done, "grounded_model_requests_total") == 12      # search, answer, redirect, cite+answer
    assert value(done, "grounded_model_tokens_total", direction="input") == 12 * 11   # the fake's usage
    assert value(done, "grounded_model_tokens_total", direction="output") == 12 * 7
    assert value(done, "grounded_model_request_duration_seconds_count") == 12
    assert value(done, "grounded_job_duration_seconds_count") == 3
