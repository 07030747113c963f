"""Flower (`grounded flower`) against the real test Redis and a real worker: it sees the worker,
shows each job's task by its `grounded.` name with its batch and custom id, a conversation's turns
as PROGRESS, a succeeded job's citation status and a failed job as a FAILURE with its error (H12)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi import Request
from fastapi.responses import JSONResponse

from tests.conftest import REPO, RedisSpace, worker_env
from tests.worker.conftest import (
    FAKE_KEY,
    FAKE_KEY_ENV,
    MISSING_KEY_ENV,
    PASSAGES,
    Cluster,
    question_config,
    settings_for,
)
from tests.worker.fake_openai import FakeOpenAI
from worker.producer import Producer
from worker.store.embedded import free_port
from worker.store.keys import QUEUE
from worker.store.metrics import read_snapshot
from worker.tasks.celery_app import ANSWER_JOB
from worker.tasks.events import FLOWER_TASK_COLUMNS, PROGRESS_STATE, progress_text, task_labels
from worker.tasks.worker_process import WorkerProcess

AUTH = ("ops", "flower-test-password")
HOLD_S = 4.0


class HoldingOpenAI(FakeOpenAI):
    """The fake model, plus `[hold:ID]` in the newest user message: the first request for that turn
    waits HOLD_S, so the test can look at Flower while a conversation is between turns."""

    def __init__(self) -> None:
        super().__init__()
        self.held: set[str] = set()

    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        users = [m.get("content") for m in body.get("messages", []) if m.get("role") == "user"]
        newest = users[-1] if users and isinstance(users[-1], str) else ""
        for key in re.findall(r"\[hold:(\w+)\]", newest):
            if key not in self.held:
                self.held.add(key)
                await asyncio.sleep(HOLD_S)
        return await super().chat(request)


@pytest.fixture
def holding_openai() -> Iterator[HoldingOpenAI]:
    server = HoldingOpenAI().start()
    yield server
    server.stop()


@pytest.fixture
def flower_and_worker(redis_space: RedisSpace, data_dir: Path, tmp_path: Path,
                      worker_process: Callable[..., WorkerProcess]) -> Iterator[tuple[str, WorkerProcess]]:
    """`grounded flower` as shipped, configured only by the environment a worker gets, plus Flower's
    own FLOWER_BASIC_AUTH (no password on its command line)."""
    env = worker_env(redis_space, data_dir, **{FAKE_KEY_ENV: FAKE_KEY, MISSING_KEY_ENV: None})
    worker = worker_process(env, wait=False)
    port = free_port()
    log = tmp_path / "flower.log"
    with log.open("wb") as handle:
        flower = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "flower", "--address", "127.0.0.1", "--port", str(port)],
            cwd=REPO, env={**env, "FLOWER_BASIC_AUTH": f"{AUTH[0]}:{AUTH[1]}"}, stdout=handle,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert flower.poll() is None, log.read_text()
            try:
                if httpx2.get(f"{url}/healthcheck", timeout=1).status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        worker.wait_ready()
        yield url, worker
    finally:
        flower.terminate()
        try:
            flower.wait(timeout=10)
        except subprocess.TimeoutExpired:
            flower.kill()


def api(url: str, path: str) -> Any:
    response = httpx2.get(f"{url}{path}", auth=AUTH, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def workers_seen(url: str, name: str, timeout: float = 30.0) -> dict:
    """Flower applies inspect replies on its event loop after answering, so ask, then read again; a
    worker that joined the broadcast channel after an ask misses it, so keep asking until it answers."""
    deadline = time.monotonic() + timeout
    workers: dict = {}
    while name not in workers and time.monotonic() < deadline:
        workers = api(url, "/api/workers?refresh=1")
        if name not in workers:
            time.sleep(0.5)
            workers = api(url, "/api/workers")
    return workers


def poll_task(url: str, task_id: str, until: Callable[[dict], bool], timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    seen: list[Any] = []
    while time.monotonic() < deadline:
        response = httpx2.get(f"{url}/api/task/info/{task_id}", auth=AUTH, timeout=5)
        if response.status_code == 200:
            info = response.json()
            seen.append(info.get("state"))
            if until(info):
                return info
        time.sleep(0.1)
    raise AssertionError(f"task {task_id} never matched; states seen: {seen[-10:]}")


def test_flower_shows_the_worker_and_a_conversation_task_with_its_progress(
    flower_and_worker: tuple[str, WorkerProcess], redis_space: RedisSpace, data_dir: Path,
    holding_openai: HoldingOpenAI,
) -> None:
    url, worker = flower_and_worker
    assert httpx2.get(f"{url}/api/workers", timeout=5).status_code == 401   # basic auth guards the API
    assert worker.name in workers_seen(url, worker.name)

    producer = Producer(settings_for(redis_space, data_dir))
    cluster = Cluster(redis_space, worker, producer)
    config = question_config(PASSAGES, model="fake-model",
                             endpoint={"base_url": holding_openai.base_url, "api_key_env": FAKE_KEY_ENV})
    turns = ["When does the observatory open?", "[hold:fl1] And when does it close on Sundays?"]
    batch_id = cluster.submit([{"custom_id": "conv-1", "turns": turns}], config)
    [job_id] = cluster.store.job_ids(batch_id)
    job = cluster.store.load_job(job_id)
    assert job is not None
    labels = task_labels(job)

    between_turns = poll_task(url, job_id, lambda info: info["state"] == PROGRESS_STATE)
    assert between_turns["result"] == progress_text(1, 2)
    assert (between_turns["name"], between_turns["args"], between_turns["kwargs"]) == (
        ANSWER_JOB, labels["argsrepr"], labels["kwargsrepr"])
    assert "'custom_id': 'conv-1'" in between_turns["kwargs"] and batch_id in between_turns["kwargs"]
    assert read_snapshot(cluster.store, [QUEUE], time.time()).reserved == 1   # taken, not yet acknowledged

    finished = poll_task(url, job_id, lambda info: info["state"] == "SUCCESS")
    assert cluster.wait(batch_id).succeeded == 1
    assert finished["name"].startswith("grounded.") and finished["worker"] == worker.name
    [result] = cluster.store.iter_results(batch_id)
    statuses = ", ".join(turn.citation_status for turn in result.turns)   # each turn's, in order
    assert len(result.turns) == 2 and finished["result"] == repr(f"succeeded: {statuses}")

    listed = api(url, "/api/tasks?limit=20")
    assert listed[job_id]["name"] == ANSWER_JOB and listed[job_id]["state"] == "SUCCESS"
    producer.app.close()


def dashboard_count(url: str, counter: str, *, until: int, timeout: float = 20.0) -> int:
    """A count on Flower's dashboard ("Failed" is `task-failed`): the sum over workers of the counter
    in `/workers?json=1`, the data the dashboard's page reads; asked again until it reaches `until`."""
    deadline = time.monotonic() + timeout
    while True:
        total = sum(int(worker.get(counter, 0)) for worker in api(url, "/workers?json=1")["data"])
        if total >= until or time.monotonic() > deadline:
            return total
        time.sleep(0.2)


def task_list(url: str) -> list[dict]:
    """What Flower's /tasks page shows: the rows its table fetches, newest first."""
    params = {"draw": 1, "start": 0, "length": 100, "search[value]": "", "order[0][column]": 0,
              "order[0][dir]": "desc", "columns[0][data]": "received"}
    response = httpx2.get(f"{url}/tasks/datatable", params=params, auth=AUTH, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def test_H12_a_failed_job_is_a_flower_failure_with_its_error_and_every_task_shows_batch_and_custom_id(
    flower_and_worker: tuple[str, WorkerProcess], redis_space: RedisSpace, data_dir: Path, fake_openai: FakeOpenAI,
) -> None:
    """A job that fails (ModelUnavailable: its key variable is not set on the worker) is a Celery
    FAILURE carrying the error type and message, counted in the dashboard's "Failed", while its result is stored, counted once, its batch
    goes on and its task is acknowledged, not redelivered. A job retried after two 429s keeps its
    labels, and succeeds with its citation status as the task result."""
    url, worker = flower_and_worker
    assert worker.name in workers_seen(url, worker.name)
    producer = Producer(settings_for(redis_space, data_dir))
    cluster = Cluster(redis_space, worker, producer)
    endpoint = {"base_url": fake_openai.base_url, "api_key_env": FAKE_KEY_ENV}
    failing = cluster.submit([{"custom_id": f"nokey-{i}", "question": "When does the observatory open?"}
                              for i in range(2)],
                             question_config(PASSAGES, model="fake-model",
                                             endpoint={**endpoint, "api_key_env": MISSING_KEY_ENV}))
    flaky = cluster.submit([{"custom_id": "flaky-hours", "question": "[flaky:flw1] When does the observatory open?"}],
                           question_config(PASSAGES, model="fake-model", endpoint=endpoint))
    failed_ids, [flaky_id] = cluster.store.job_ids(failing), cluster.store.job_ids(flaky)

    for job_id in failed_ids:
        info = poll_task(url, job_id, lambda info: info["state"] == "FAILURE")
        assert info["exception"].startswith(("JobFailed('ModelUnavailable: ", 'JobFailed("ModelUnavailable: '))
        assert f"names '{MISSING_KEY_ENV}', which is not set" in info["exception"]
    assert dashboard_count(url, "task-failed", until=2) == 2   # the dashboard's "Failed", not 0
    progress = cluster.wait(failing)
    assert (progress.failed, progress.succeeded, progress.state) == (2, 0, "completed")   # the batch went on
    results = list(cluster.store.iter_results(failing))
    assert [(r.status, r.error.type if r.error else None, r.attempts) for r in results] == [
        ("failed", "ModelUnavailable", 1)] * 2
    assert read_snapshot(cluster.store, [QUEUE], time.time()).counters["jobs:failed:question"] == 2

    succeeded = poll_task(url, flaky_id, lambda info: info["state"] == "SUCCESS")
    assert succeeded["result"] == repr("succeeded: grounded") and succeeded["retries"] == 2
    assert "'custom_id': 'flaky-hours'" in succeeded["kwargs"] and flaky in succeeded["kwargs"]
    assert dashboard_count(url, "task-succeeded", until=1) == 1
    assert dashboard_count(url, "task-failed", until=3, timeout=1) == 2   # its 429s were retries, not failures

    deadline = time.monotonic() + 20   # acknowledged: nothing left reserved, nothing queued again
    while (snapshot := read_snapshot(cluster.store, [QUEUE], time.time())).reserved:
        assert time.monotonic() < deadline, "a finished job's task was never acknowledged"
        time.sleep(0.2)
    assert snapshot.queues[QUEUE].depth == 0
    events = [fields["event"] for _, fields in cluster.store.events(failing)]
    assert (events.count("job_started"), events.count("job_finished")) == (2, 2)

    page = httpx2.get(f"{url}/tasks", auth=AUTH, timeout=10).text
    for header in ("kwargs", "Result", "Exception"):
        assert f">{header}<" in page, f"the task list has no {header} column"
    assert FLOWER_TASK_COLUMNS.split(",")[:3] == ["name", "uuid", "state"]
    rows = {row["uuid"]: row for row in task_list(url)}
    for job_id, batch_id, custom_id in [(failed_ids[0], failing, "nokey-0"), (failed_ids[1], failing, "nokey-1"),
                                        (flaky_id, flaky, "flaky-hours")]:
        assert batch_id in rows[job_id]["kwargs"] and f"'custom_id': '{custom_id}'" in rows[job_id]["kwargs"]
    assert [rows[j]["state"] for j in failed_ids] == ["FAILURE", "FAILURE"]
    assert set(api(url, "/api/tasks?state=FAILURE")) == set(failed_ids)
    producer.app.close()
