"""A worker as a local subprocess: what `grounded demo` and the integration tests start.

It is a real `celery worker` process (threads pool) configured only through its environment, the
way a deployed worker is, and it is ready once it answers a remote-control ping.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from worker.settings import Settings
from worker.store.keys import QUEUE

from .celery_app import create_app

REPO = Path(__file__).resolve().parents[2]


class WorkerDidNotStart(RuntimeError):
    pass


def default_node_name() -> str:
    """Unique among the workers of one host (Celery's default, celery@HOST, is not), so the per-worker
    remote-control commands and Flower can tell them apart; GROUNDED_WORKER_NAME or --name set it."""
    return f"grounded-{os.getpid()}@{socket.gethostname()}"


def worker_argv(*, name: str, pool: str, concurrency: int, loglevel: str = "info") -> list[str]:
    """The `celery worker` arguments every worker runs with: `grounded worker`, the demo and the tests.

    No gossip (its receiver logs a traceback when Redis restarts, and nothing here uses elections
    or clock sync) and no mingle (start-up syncing of revoked ids we never revoke). Heartbeats stay:
    Flower marks workers online from them.
    """
    return ["worker", "--pool", pool, "--concurrency", str(concurrency), "--queues", QUEUE, "--hostname", name,
            "--loglevel", loglevel, "--task-events", "--without-gossip", "--without-mingle"]


@dataclass
class WorkerProcess:
    process: subprocess.Popen[bytes]
    log: Path
    name: str
    env: dict[str, str] = field(repr=False)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_ready(self, timeout: float = 60.0) -> None:
        settings = Settings(redis_url=self.env["GROUNDED_REDIS_URL"],
                            key_prefix=self.env.get("GROUNDED_KEY_PREFIX", "grounded:"))
        app = create_app(settings)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise WorkerDidNotStart(f"worker exited with {self.process.returncode}:\n{self.output()[-3000:]}")
                if app.control.ping(destination=[self.name], timeout=0.5):
                    return
            raise WorkerDidNotStart(f"worker not ready after {timeout:g} s:\n{self.output()[-3000:]}")
        finally:
            app.close()

    def stop(self, timeout: float = 15.0) -> None:
        """A warm shutdown: running jobs finish (SIGTERM), then a kill if they take too long."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=5)


def start_worker_process(env: dict[str, str], log: Path, *, concurrency: int = 4, wait: bool = True,
                       loglevel: str = "info", command_prefix: Sequence[str] = ()) -> WorkerProcess:
    """`command_prefix` runs the worker under another program that execs it (so signals still
    reach the worker), such as the tests' read-only mount namespace."""
    name = f"local-{uuid.uuid4().hex[:8]}@localhost"
    command = [*command_prefix, sys.executable, "-m", "celery", "-A", "worker.app",
               *worker_argv(name=name, pool="threads", concurrency=concurrency, loglevel=loglevel)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as handle:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
    worker = WorkerProcess(process, log, name, env)
    if wait:
        try:
            worker.wait_ready()
        except BaseException:
            worker.stop()
            raise
    return worker
