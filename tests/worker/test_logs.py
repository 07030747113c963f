"""Worker logs: JSON unless a person is watching, the job's ids on every line, nothing secret.

The in-process tests run the real task body (`answer_job.apply`) against the real test Redis, with
structlog's `capture_logs` in place of the renderer; the last test reads a real worker's output.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

from tests.conftest import TEST_TAG_KEY, RedisSpace, worker_env
from tests.worker.conftest import PASSAGES, POLICY, Cluster, question_config
from worker.jobs.lines import parse_batch
from worker.settings import get_settings
from worker.tasks import answer, process
from worker.tasks.logs import JOB_FIELDS, MAX_VALUE_CHARS, REDACTED, redact, renderer_for

QUESTION = "When does the observatory open?"


@pytest.fixture
def in_process(redis_space: RedisSpace, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RedisSpace]:
    """This process configured as a worker would be: settings from the same env a worker gets."""
    for name in [n for n in os.environ if n.startswith("GROUNDED_")]:
        monkeypatch.delenv(name)
    for name, value in worker_env(redis_space, data_dir).items():
        if name.startswith("GROUNDED_"):
            monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    process._worker.reset()
    yield redis_space
    get_settings.cache_clear()
    process._worker.reset()


def submit_unqueued(space: RedisSpace, lines: list[dict], tenant: str):  # -> (Batch, list[Job])
    report = parse_batch(lines, question_config(PASSAGES, POLICY))
    assert report.ok
    return space.store().create_batch(report, tenant=tenant)


def run_in_process(job_id: str) -> tuple[str, list[dict]]:
    with capture_logs(processors=[structlog.contextvars.merge_contextvars, redact]) as lines:
        status = answer.answer_job.apply(args=[job_id]).get()
    return status, lines


def test_every_job_line_carries_job_batch_tenant_custom_id_and_attempt(in_process: RedisSpace) -> None:
    batch, [job] = submit_unqueued(in_process, [{"custom_id": "hours", "question": QUESTION}], "acme")
    status, lines = run_in_process(job.id)
    assert status == "succeeded: grounded"   # the task result Flower shows (H12)
    assert [line["event"] for line in lines][-1] == "job_finished"
    for line in lines:
        assert {name: line.get(name) for name in JOB_FIELDS} == {
            "job_id": job.id, "batch_id": batch.id, "tenant": "acme", "custom_id": "hours", "attempt": 1,
        }, line


def test_a_second_start_logs_attempt_2_and_the_next_job_does_not_inherit_it(in_process: RedisSpace) -> None:
    batch, [first, second] = submit_unqueued(
        in_process, [{"custom_id": "a", "question": QUESTION}, {"custom_id": "b", "question": QUESTION}], "acme")
    run_in_process(first.id)
    _, again = run_in_process(first.id)
    assert {line["attempt"] for line in again} == {2}
    _, other = run_in_process(second.id)
    assert {(line["custom_id"], line["attempt"]) for line in other} == {("b", 1)}
    assert set(structlog.contextvars.get_contextvars()) & set(JOB_FIELDS) == set()


def test_job_lines_hold_no_question_answer_passage_or_tag_key(in_process: RedisSpace) -> None:
    _, [job] = submit_unqueued(in_process, [{"custom_id": "hours", "question": QUESTION}], "acme")
    status, lines = run_in_process(job.id)
    result = in_process.store().load_result(job.id)
    assert status == "succeeded: grounded" and result is not None
    turn = result.turns[0]
    text = json.dumps(lines, default=str)
    secrets_and_text = [QUESTION, str(turn.answer), TEST_TAG_KEY, *[c.content for c in turn.cited]]
    assert turn.cited and all(s for s in secrets_and_text)
    assert [s for s in secrets_and_text if s in text] == []


def test_redact_hides_values_under_secret_names_and_cuts_long_text() -> None:
    long = "passage " * 200
    event = redact(None, "info", {
        "event": "x", "api_key": "sk-123", "tag_keys": ["k1"], "api_tokens": {"t": "acme"},
        "authorization": "Bearer t", "refresh_token": "r", "input_tokens": 12, "key_prefix": "grounded:",
        "error": long,
    })
    assert [event[k] for k in ("api_key", "tag_keys", "api_tokens", "authorization", "refresh_token")] == [REDACTED] * 5
    assert (event["input_tokens"], event["key_prefix"]) == (12, "grounded:")
    assert event["error"].startswith(long[:MAX_VALUE_CHARS]) and len(event["error"]) < len(long)
    assert event["error"].endswith(f"[{len(long) - MAX_VALUE_CHARS} more chars]")


def test_json_by_default_and_console_renderer_on_a_terminal() -> None:
    read_end, write_end = os.pipe()
    master, slave = os.openpty()
    with os.fdopen(write_end, "w") as pipe, os.fdopen(slave, "w") as tty:
        assert isinstance(renderer_for(pipe), structlog.processors.JSONRenderer)
        assert isinstance(renderer_for(tty), structlog.dev.ConsoleRenderer)
    os.close(read_end)
    os.close(master)


def test_a_real_worker_writes_json_lines_with_the_job_ids(cluster: Cluster) -> None:
    """Celery's own lines go through the same formatter (logs.configure_worker_logging)."""
    batch_id = cluster.submit([{"custom_id": "json-lines", "question": QUESTION}], question_config(PASSAGES, POLICY))
    cluster.wait(batch_id)
    [job_id] = cluster.store.job_ids(batch_id)
    worker = cluster.worker
    assert worker is not None

    def records() -> list[dict]:
        complete = worker.output().split("\n")[:-1]  # the last piece may still be being written
        return [json.loads(raw) for raw in complete if raw.startswith("{")]

    def finished() -> list[dict]:  # the line follows the result's write, which is what wait() sees
        return [r for r in records() if r.get("event") == "job_finished" and r.get("job_id") == job_id]

    deadline = time.monotonic() + 10
    while not finished() and time.monotonic() < deadline:
        time.sleep(0.05)
    [line] = finished()
    assert {k: line[k] for k in ("batch_id", "tenant", "custom_id", "attempt", "level")} == {
        "batch_id": batch_id, "tenant": "tests", "custom_id": "json-lines", "attempt": 1, "level": "info"}
    celery_lines = [r for r in records() if str(r.get("logger", "")).startswith("celery") and job_id in r["event"]]
    assert celery_lines and all("timestamp" in r and "level" in r for r in celery_lines)


def test_stdlib_and_celery_exceptions_keep_their_traceback_in_json(capfd: pytest.CaptureFixture[str]) -> None:
    """Celery logs a failing task through the stdlib; without its traceback nobody can tell why."""
    import logging

    from worker.tasks.logs import configure_worker_logging

    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure_worker_logging()
        try:
            raise ZeroDivisionError("boom")
        except ZeroDivisionError:
            logging.getLogger("celery.worker").exception("task_failed")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    line = json.loads(capfd.readouterr().err.strip().splitlines()[-1])
    assert line["event"] == "task_failed" and "ZeroDivisionError: boom" in line["exception"]
