"""Model faults through the fake OpenAI-compatible server, all in one batch on one real worker.

Each job meets one fault: HTTP errors with and without Retry-After, malformed or truncated bodies,
a request that hangs, a body that never ends, malformed tool arguments, a tool that does not exist.
Transient faults are retried and the job answers; the rest fail that job with a clear error; the
batch always finishes, and the healthy jobs beside them are untouched.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import RedisServer, new_space, worker_env
from tests.reliability.conftest import RECOVERY, endpoint_config, launch_worker
from tests.reliability.faulty_openai import FAULTS, UNKNOWN_TOOL, FaultyOpenAI
from tests.worker.conftest import FAKE_KEY, FAKE_KEY_ENV, settings_for
from tests.worker.fake_openai import FAKE_ANSWER
from worker.jobs.models import JobResult
from worker.producer import Producer

pytestmark = pytest.mark.slow

RETRIES = 2
TIMEOUT_S = 4
QUESTION = "When does the observatory open?"
RUN = uuid.uuid4().hex[:6]  # the fake server counts requests per key for the whole session

# custom_id -> the fault marker its question carries (the fault and how many requests it hits)
FAULT_JOBS = {
    "429-twice": "429:2",
    "500-once": "500:1",
    "504-once": "504:1",
    "503-always": "503:all",
    "400-always": "400:all",
    "malformed-once": "malformed:1",
    "malformed-always": "malformed:all",
    "truncated-once": "truncated:1",
    "hang": "hang:1",
    "endless": "endless:1",
    "badargs-once": "badargs:1",
    "badargs-always": "badargs:all",
    "unknowntool-once": "unknowntool:1",
    "unknowntool-always": "unknowntool:all",
}
HEALTHY = [f"healthy-{i}" for i in range(4)]
FAULT_KINDS_TRIED = sorted({marker.split(":")[0] for marker in FAULT_JOBS.values()})


def question_for(custom_id: str) -> str:
    if custom_id in FAULT_JOBS:
        kind, n = FAULT_JOBS[custom_id].split(":")
        return f"[fault:{kind}:{custom_id.replace('-', '')}{RUN}:{n}] {QUESTION}"
    return QUESTION


@dataclass
class FaultBatch:
    results: dict[str, JobResult]
    retrying: Counter[str]
    finished: Counter[str]
    state: str

    def __getitem__(self, custom_id: str) -> JobResult:
        return self.results[custom_id]


@pytest.fixture(scope="module")
def fault_batch(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, faulty_openai: FaultyOpenAI,
                rel_data_dir: Path) -> Iterator[FaultBatch]:
    space = new_space(redis_server)
    env = worker_env(space, rel_data_dir, **{FAKE_KEY_ENV: FAKE_KEY, **RECOVERY, "GROUNDED_RETRY_MAX_S": "1.5"})
    worker = launch_worker(env, tmp_path_factory.mktemp("fault-logs"), concurrency=6)
    producer = Producer(settings_for(space, rel_data_dir))
    try:
        lines = [{"custom_id": c, "question": question_for(c)} for c in [*FAULT_JOBS, *HEALTHY]]
        config = endpoint_config(faulty_openai, run={"retries": RETRIES, "timeout_s": TIMEOUT_S})
        report = producer.validate(lines, config)
        assert report.ok, [e.as_dict() for e in report.errors]
        batch = producer.submit(report, tenant="faults")
        deadline = time.monotonic() + 90
        while not (progress := producer.store.progress(batch.id)).finished:
            assert time.monotonic() < deadline, f"{progress}\n{worker.output()[-4000:]}"
            time.sleep(0.2)
        events = [fields for _, fields in producer.store.events(batch.id)]
        ids = {r.job_id: r.custom_id for r in producer.store.iter_results(batch.id)}
        yield FaultBatch(
            results={r.custom_id: r for r in producer.store.iter_results(batch.id)},
            retrying=Counter(ids[e["job_id"]] for e in events if e["event"] == "job_retrying"),
            finished=Counter(ids[e["job_id"]] for e in events if e["event"] == "job_finished"),
            state=progress.state,
        )
    finally:
        worker.stop()
        producer.app.close()
        space.clean()


def answered(result: JobResult) -> bool:
    return result.status == "succeeded" and result.error is None and result.turns[0].answer == FAKE_ANSWER


def test_every_fault_kind_was_served_and_the_batch_finished(fault_batch: FaultBatch, faulty_openai) -> None:
    assert fault_batch.state == "completed"
    assert set(fault_batch.results) == {*FAULT_JOBS, *HEALTHY}
    assert set(fault_batch.finished.values()) == {1}
    served = {kind for kind, key in faulty_openai.faults_served if key.endswith(RUN)}
    assert served == set(FAULT_KINDS_TRIED) and served <= set(FAULTS)


def test_healthy_jobs_beside_faulty_ones_answer_first_time(fault_batch: FaultBatch) -> None:
    for custom_id in HEALTHY:
        result = fault_batch[custom_id]
        assert answered(result) and result.attempts == 1 and result.turns[0].citation_status == "grounded"


def test_H6_429_with_retry_after_is_retried_and_answers(fault_batch: FaultBatch) -> None:
    result = fault_batch["429-twice"]
    assert answered(result) and result.attempts == 3 and fault_batch.retrying["429-twice"] == 2


@pytest.mark.parametrize("custom_id", ["500-once", "504-once"])
def test_H6_a_5xx_or_gateway_timeout_is_retried_and_answers(fault_batch: FaultBatch, custom_id: str) -> None:
    result = fault_batch[custom_id]
    assert answered(result) and result.attempts == 2 and fault_batch.retrying[custom_id] == 1


def test_poison_a_job_failing_every_attempt_ends_failed_with_its_error_after_its_retries(
    fault_batch: FaultBatch,
) -> None:
    result = fault_batch["503-always"]
    assert result.status == "failed" and result.attempts == RETRIES + 1
    assert fault_batch.retrying["503-always"] == RETRIES
    assert result.error is not None and result.error.type == "ModelUnavailableError"
    assert "status_code: 503" in result.error.message and "temporarily unavailable" in result.error.message


def test_a_rejected_request_fails_at_once_without_retries(fault_batch: FaultBatch) -> None:
    result = fault_batch["400-always"]
    assert result.status == "failed" and result.attempts == 1 and fault_batch.retrying["400-always"] == 0
    assert result.error is not None and "400" in result.error.message and "does not support tools" in result.error.message


@pytest.mark.parametrize("custom_id", ["hang", "endless"])
def test_a_request_that_hangs_or_never_ends_fails_the_job_at_its_timeout(fault_batch: FaultBatch, custom_id: str) -> None:
    result = fault_batch[custom_id]
    assert result.status == "failed" and result.error is not None and result.error.type == "TimeoutError"
    assert f"did not finish within {TIMEOUT_S} s" in result.error.message
    assert result.turns == [] and result.state_after == {}


@pytest.mark.parametrize("custom_id", ["badargs-once", "unknowntool-once"])
def test_one_bad_tool_call_is_sent_back_to_the_model_and_the_job_answers(fault_batch: FaultBatch, custom_id: str) -> None:
    result = fault_batch[custom_id]
    assert answered(result) and result.attempts == 1
    assert result.turns[0].retried_tool_returns >= 1


def test_a_model_that_keeps_calling_an_unknown_tool_fails_the_job_naming_it(fault_batch: FaultBatch) -> None:
    result = fault_batch["unknowntool-always"]
    assert result.status == "failed" and result.attempts == 1
    assert result.error is not None and result.error.type == "UnexpectedModelBehavior"
    assert f"Tool {UNKNOWN_TOOL!r} exceeded max retries" in result.error.message


def test_a_model_that_keeps_sending_malformed_arguments_fails_the_job(fault_batch: FaultBatch) -> None:
    result = fault_batch["badargs-always"]
    assert result.status == "failed" and result.attempts == 1
    assert result.error is not None and result.error.type == "UnexpectedModelBehavior"
    assert "Tool 'passages_search' exceeded max retries" in result.error.message


@pytest.mark.parametrize("custom_id", ["malformed-once", "malformed-always"])
def test_a_body_that_is_not_json_fails_the_job_saying_so(fault_batch: FaultBatch, custom_id: str) -> None:
    """A 200 whose body does not parse is a broken server, not a busy one: failed at once, clearly."""
    result = fault_batch[custom_id]
    assert result.status == "failed" and result.attempts == 1
    assert result.error is not None and result.error.type == "ModelAPIError"
    assert "Failed to decode response as JSON" in result.error.message


def test_a_completion_without_choices_fails_the_job_saying_so(fault_batch: FaultBatch) -> None:
    result = fault_batch["truncated-once"]
    assert result.status == "failed" and result.attempts == 1
    assert result.error is not None and result.error.type == "UnexpectedModelBehavior"
    assert "Invalid response from openai chat completions endpoint" in result.error.message
    assert "choices" in result.error.message
