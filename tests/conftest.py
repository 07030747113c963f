"""Shared fixtures: a real Redis for the session and real Celery worker processes.

Redis is `GROUNDED_TEST_REDIS_URL` when set (CI points it at the machine's server, db 13), else an
embedded redis-server this session starts. Tests never share keys: each gets its own key prefix,
which the results store and Celery's transport (`global_keyprefix`) both write under, and the
prefix is deleted afterwards. Nothing here mocks Redis or Celery (docs/design/architecture.md, "tests/").
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis

if TYPE_CHECKING:
    from worker.tasks.worker_process import WorkerProcess

# pytest-xdist's workers run with COLUMNS=80, which the CLI's rich consoles would fix as their width
# when first imported; tests set the width they mean where it matters (a subprocess's env, monkeypatch)
for _variable in ("COLUMNS", "LINES"):
    os.environ.pop(_variable, None)

REPO = Path(__file__).resolve().parent.parent
TEST_TAG_KEY = "test-tag-key"


@dataclass
class RedisServer:
    url: str
    embedded: object | None = None

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    url = os.environ.get("GROUNDED_TEST_REDIS_URL")
    if url:
        yield RedisServer(url)
        return
    from worker.store.embedded import EmbeddedRedis

    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    try:
        yield RedisServer(server.url(0), server)
    finally:
        server.close()


@dataclass
class RedisSpace:
    """One test's share of Redis: a key prefix nobody else uses."""

    server: RedisServer
    prefix: str

    @property
    def url(self) -> str:
        return self.server.url

    def store(self):  # -> worker.results.ResultsStore
        from worker.store.results import ResultsStore

        return ResultsStore.from_url(self.url, prefix=self.prefix)

    def clean(self) -> None:
        self.store().delete_prefix()


def new_space(server: RedisServer) -> RedisSpace:
    return RedisSpace(server, f"gwtest:{uuid.uuid4().hex[:12]}:")


@pytest.fixture
def redis_space(redis_server: RedisServer) -> Iterator[RedisSpace]:
    space = new_space(redis_server)
    try:
        yield space
    finally:
        space.clean()


def ingested_data_dir(root: Path, corpus: str) -> Path:
    """A DATA_DIR whose `corpora/` holds one corpus ingested from tests/fixtures/corpus."""
    from capabilities.corpus import ingest

    (root / "corpora").mkdir()
    ingest(root / "corpora" / f"{corpus}.sqlite", [REPO / "tests" / "fixtures" / "corpus"])
    return root


# the test key variables may be sent only to fake model servers on this machine (GROUNDED_ENDPOINT_KEY_BINDINGS)
TEST_KEY_BINDINGS = "GROUNDED_TEST_FAKE_LLM_KEY=http://127.0.0.1:*,GROUNDED_TEST_UNSET_KEY=http://127.0.0.1:*"


def worker_env(space: RedisSpace, data_dir: Path, **overrides: str | None) -> dict[str, str]:
    """The environment a worker process gets: the test's Redis space and data dir, test tag keys."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GROUNDED_")}
    env.update(
        GROUNDED_REDIS_URL=space.url,
        GROUNDED_KEY_PREFIX=space.prefix,
        GROUNDED_DATA_DIR=str(data_dir),
        GROUNDED_TAG_KEYS=TEST_TAG_KEY,
        GROUNDED_RETRY_BASE_S="0.2",
        GROUNDED_RETRY_MAX_S="5",
        GROUNDED_CONCURRENCY="4",
        GROUNDED_ENDPOINT_KEY_BINDINGS=TEST_KEY_BINDINGS,
        PYTHONWARNINGS="ignore",
    )
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def start_worker(env: dict[str, str], log_dir: Path, *, wait: bool = True) -> WorkerProcess:
    """A real `celery worker` process (threads pool) with the test's settings in its environment."""
    from worker.tasks.worker_process import start_worker_process

    return start_worker_process(env, log_dir / f"worker-{uuid.uuid4().hex[:8]}.log",
                              concurrency=int(env.get("GROUNDED_CONCURRENCY", "4")), wait=wait)


@pytest.fixture
def worker_process(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """A factory: `worker_process(env)` starts a real worker with the test's settings; all stop at teardown."""
    started: list[WorkerProcess] = []

    def start(env: dict[str, str], *, wait: bool = True) -> WorkerProcess:
        worker = start_worker(env, tmp_path, wait=wait)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def whereabouts(space: RedisSpace, batch_id: str) -> str:
    """Where each unfinished job of a batch is, for a test that timed out waiting: its copies on
    the queue, its unacknowledged deliveries (with their lease ages) and its provider-wait keys."""
    from worker.store.broker_messages import message_job_id
    from worker.store.keys import (
        BATCH_DONE_KEY,
        JOB_CHAIN_KEY,
        UNACKED_INDEX_KEY,
        UNACKED_KEY,
        queue_lanes,
    )

    client = redis.Redis.from_url(space.url)
    store = space.store()
    done = {member.decode() for member in client.smembers(store.key(BATCH_DONE_KEY, batch_id=batch_id))}
    payloads = {lane: [m.decode(errors="replace") for m in client.lrange(store.key(lane), 0, -1)]
                for lane in queue_lanes()}
    unacked = {tag.decode(): body.decode(errors="replace") for tag, body in client.hgetall(store.key(UNACKED_KEY)).items()}
    scores = {tag.decode(): score for tag, score in client.zrange(store.key(UNACKED_INDEX_KEY), 0, -1, withscores=True)}
    now = time.time()
    lines = []
    for job_id in store.job_ids(batch_id):
        if job_id in done:
            continue
        on_queue = {key: sum(message_job_id(m) == job_id for m in messages) for key, messages in payloads.items()}
        held = {tag: round(now - scores[tag], 1) if tag in scores else None
                for tag, body in unacked.items() if message_job_id(body) == job_id}
        keys = {key.decode().removeprefix(space.prefix): client.type(key).decode()
                for key in client.scan_iter(match=f"{space.prefix}job:{job_id}*")}
        chain = client.get(store.key(JOB_CHAIN_KEY, job_id=job_id))
        lines.append(f"{job_id}: on queue {on_queue}, unacked (tag: lease age s) {held}, "
                     f"chain {chain!r}, keys {sorted(keys)}")
    client.close()
    return "\n".join(lines) or "every job has a result"
