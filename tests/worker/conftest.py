"""Worker-test fixtures: a corpus directory, the fake OpenAI server, and one shared worker process.

Starting a worker costs seconds, so most integration tests share one session worker (its own key
prefix; each test submits its own batches and reads only those). Tests that need different worker
settings start their own through `worker_process`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from mcp import ClientSession, StdioServerParameters, stdio_client

from tests.conftest import (
    REPO,
    TEST_TAG_KEY,
    RedisServer,
    RedisSpace,
    ingested_data_dir,
    new_space,
    start_worker,
    worker_env,
)
from tests.worker.fake_openai import FakeOpenAI
from worker.producer import Producer
from worker.settings import Settings
from worker.store.embedded import free_port
from worker.store.results import BatchProgress, ResultsStore
from worker.tasks.worker_process import WorkerProcess

CORPUS = "handbook"
FAKE_KEY_ENV = "GROUNDED_TEST_FAKE_LLM_KEY"
FAKE_KEY = "sk-fake-test"
MISSING_KEY_ENV = "GROUNDED_TEST_UNSET_KEY"


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DATA_DIR with one corpus, `handbook`, ingested from the test fixtures."""
    return ingested_data_dir(tmp_path_factory.mktemp("data"), CORPUS)


@pytest.fixture(scope="session")
def fake_openai() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start()
    yield server
    server.stop()


def settings_for(space: RedisSpace, data_dir: Path, **extra: object) -> Settings:
    return Settings(redis_url=space.url, key_prefix=space.prefix, data_dir=data_dir,
                    tag_keys=[TEST_TAG_KEY], **extra)  # type: ignore[arg-type]


@dataclass
class Cluster:
    """A Redis space with a running worker, and a producer for it."""

    space: RedisSpace
    worker: WorkerProcess | None
    producer: Producer

    @property
    def store(self) -> ResultsStore:
        return self.producer.store

    def submit(self, lines: list, config: dict | str, *, tenant: str = "tests", arm: str | None = None) -> str:
        report = self.producer.validate(lines, config)
        assert report.ok, [e.as_dict() for e in report.errors]
        return self.producer.submit(report, tenant=tenant, arm=arm).id

    def wait(self, batch_id: str, timeout: float = 60.0) -> BatchProgress:
        finished = self.store.wait_finished(batch_id, timeout)
        progress = self.store.progress(batch_id)
        assert progress is not None
        if not finished:
            log = self.worker.output()[-4000:] if self.worker else ""
            raise AssertionError(f"batch {batch_id} not finished: {progress}\n{log}")
        return progress


@pytest.fixture(scope="session")
def cluster(redis_server: RedisServer, data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    space = new_space(redis_server)
    env = worker_env(space, data_dir, **{FAKE_KEY_ENV: FAKE_KEY, MISSING_KEY_ENV: None})
    worker = start_worker(env, tmp_path_factory.mktemp("worker-logs"))
    producer = Producer(settings_for(space, data_dir))
    try:
        yield Cluster(space, worker, producer)
    finally:
        worker.stop()
        producer.app.close()
        space.clean()


def question_config(*capabilities: object, model: str = "extractive", **extra: object) -> dict:
    return {"agent": {"model": model, "instructions": "Answer from the knowledge base.",
                      "capabilities": list(capabilities)}, **extra}


PASSAGES = {"PassageSearchCapability": {"corpus": CORPUS}}
POLICY = "CitationPolicyCapability"


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """An ASGI app on a free 127.0.0.1 port in a thread, for as long as the block runs."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the API did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)


@contextlib.asynccontextmanager
async def mcp_stdio(space: RedisSpace, data_dir: Path, tenant: str, **env: str) -> AsyncIterator[ClientSession]:
    """`grounded mcp` started as a desktop agent starts it, with the official client on its stdio;
    `env` adds GROUNDED_ settings (configs, tenant scopes, embedding endpoints)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GROUNDED_")}
    environ.update(GROUNDED_REDIS_URL=space.url, GROUNDED_KEY_PREFIX=space.prefix, GROUNDED_DATA_DIR=str(data_dir),
                   GROUNDED_TAG_KEYS=TEST_TAG_KEY, GROUNDED_CLI_TENANT=tenant, **env)
    params = StdioServerParameters(command=sys.executable, args=["-m", "worker.cli", "mcp"], env=environ, cwd=str(REPO))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


TOKENS = {"tok-acme": "acme", "tok-globex": "globex"}


@pytest.fixture(scope="module")
def api_url(cluster: Cluster, data_dir: Path) -> Iterator[str]:
    """The producer API over the session cluster, with a token for each of two tenants (TOKENS)."""
    from worker.api.app import create_api

    settings = settings_for(cluster.space, data_dir, api_tokens=TOKENS)
    with serve(create_api(settings, producer=Producer(settings, store=cluster.store, app=cluster.producer.app))) as url:
        yield url
