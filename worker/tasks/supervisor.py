"""`grounded worker --processes N`: N worker processes on one host, forked from one that has already
imported the worker, started again at once when one dies, and stopped together.

One worker process runs all its jobs on one event loop, and Python runs that loop on one core at a
time (the GIL), so a host's other cores stay idle however many threads the process has
(docs/benchmarks.md, scale-out). The supervisor runs N children, each a whole worker with its own
Celery consumer, threads pool and event loop, named `<name>-<i>@<host>` from the base node name so
Flower and remote control tell them apart.

- **Start.** The supervisor imports the worker once (`preload`: Celery's worker, pydantic-ai, the
  model client) and forks every child from itself. A child is taking jobs a fraction of a second
  after it starts, where a fresh interpreter spends 2-3 s importing; under repeated kills that
  start-up is most of what a worker lives (docs/reliability.md). Fork copies only the calling
  thread, so the supervisor starts no thread and opens no connection before forking.
- **Stop.** The first SIGTERM or SIGINT is forwarded to every child as SIGTERM: Celery's warm
  shutdown, in which each child stops taking jobs and finishes the ones it runs, exactly as one
  process does. A second one forwards SIGQUIT, Celery's cold shutdown: running jobs are left
  unacknowledged and come back when their leases expire (H14), as when one process is killed. The
  supervisor exits once every child has.
- **Recovery.** A child that dies after it was ready (a crash, an out-of-memory kill, kill -9) is
  forked again at once, at most once a RESTART_INTERVAL_S: the jobs it held come back the way a
  lost worker's always do (H14), and a job that keeps killing its worker fails after
  GROUNDED_MAX_WORKER_LOSSES, so restarting cannot run one bad job for ever. A child that dies
  before it was ready MAX_BOOT_FAILURES times in a row is a broken host or configuration, not bad
  luck: the supervisor stops the others and exits with 1.
- **Children never outlive it.** They run in their own session, so a terminal's Ctrl-C reaches
  only the supervisor (which forwards it once), and on Linux the kernel sends them SIGTERM if the
  supervisor itself is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import NoReturn

import structlog
from celery.signals import worker_ready
from genai_prices.data_snapshot import get_snapshot

from .celery_app import TASK_MODULES

RESTART_INTERVAL_S = 1.0
MAX_BOOT_FAILURES = 3
POLL_S = 0.1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_PR_SET_PDEATHSIG = 1

PRELOADED = (
    "worker.app",  # the app, the capabilities, pydantic-ai, the stores
    *TASK_MODULES,
    "celery.bin.celery",  # Celery's command line, with every plugin's subcommand (Flower's: tornado)
    "celery.bin.worker",
    "celery.apps.worker",
    "celery.worker.components",
    "celery.worker.consumer",
    "celery.worker.strategy",
    "celery.events.dispatcher",
    "celery.concurrency.thread",
    "kombu.pidbox",
    "kombu.transport.redis",
    "worker.tasks.broker",
    "pydantic_ai.models.openai",  # a job's model client: about 0.7 s on a worker's first job
    "pydantic_ai.providers.openai",
)
"""What every child would otherwise import for itself (0.9 s of a child's start before this list);
importing builds no connection and starts no thread."""

log = structlog.get_logger()


def preload() -> None:
    """Imports what a worker runs on, once, in the supervisor, so that forked children share it."""
    for module in PRELOADED:
        importlib.import_module(module)
    get_snapshot()  # genai-prices' price data, which every model client loads when it is built


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def child_names(base: str, n: int) -> list[str]:
    """`grounded@host` -> `grounded-1@host`, `grounded-2@host`, ...: distinct, and still on `host`."""
    local, at, host = base.partition("@")
    return [f"{local}-{i}{at}{host}" for i in range(1, n + 1)]


def _die_with_parent() -> None:
    """SIGTERM to this process when the supervisor dies (Linux only)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


@dataclass
class _Child:
    name: str
    pid: int | None = None
    ready_fd: int | None = None  # the read end of the pipe the child writes to once Celery is ready
    ready: bool = False
    started_at: float = 0.0
    boot_failures: int = 0  # deaths before ready, in a row

    def notice_ready(self) -> None:
        """Reads the child's note that Celery is ready; the byte stays in the pipe after the child
        has exited, so whether it was ready is known when it dies."""
        if not self.ready and self.ready_fd is not None:
            with contextlib.suppress(BlockingIOError):
                self.ready = bool(os.read(self.ready_fd, 1))
            if self.ready:
                self.boot_failures = 0

    def exit_code(self) -> int | None:
        """None while the child runs; once it has ended, its exit code, or minus the signal that killed it."""
        if self.pid is None:
            return 0
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = self.pid, 0
        if pid == 0:
            return None
        self.pid = None
        self.notice_ready()
        if self.ready_fd is not None:
            os.close(self.ready_fd)
            self.ready_fd = None
        return os.waitstatus_to_exitcode(status)

    def running(self) -> bool:
        return self.pid is not None

    def signal(self, signum: int) -> None:
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)


def _run_forked(run: Callable[[str], int], name: str, ready_fd: int, inherited: Sequence[int]) -> NoReturn:
    """The child's side of the fork: its own session, default signal handlers, a note to the
    supervisor once Celery is ready, the worker, and an exit that never returns into the
    supervisor's code."""
    code = 1
    try:
        os.setsid()
        if sys.platform.startswith("linux"):
            _die_with_parent()
        for fd in inherited:
            os.close(fd)
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked by the supervisor around fork
        worker_ready.connect(lambda **_: os.write(ready_fd, b"r"), weak=False)
        code = run(name)
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


class Supervisor:
    """Children named `names`, each running `run(name)` (a worker's whole life; its return value is
    the exit code) in a process forked from this one."""

    def __init__(self, names: Sequence[str], run: Callable[[str], int]) -> None:
        self.children = [_Child(name) for name in names]
        self.run_child = run
        self.stops = 0  # signals received: 1 is a warm stop, 2 or more a cold one
        self.received: list[tuple[int, signal.Signals]] = []  # (signal, what was forwarded), not yet logged
        self.failed = False

    def _forwarded(self) -> signal.Signals:
        return signal.SIGTERM if self.stops == 1 else signal.SIGQUIT

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Counts and forwards, nothing more: a handler runs between any two steps of the loop,
        so a log line here could wait for ever on the log's lock held by the line it interrupted."""
        self.stops += 1
        self.received.append((signum, self._forwarded()))
        for child in self.children:
            child.signal(self._forwarded())

    def _log_received(self) -> None:
        while self.received:
            signum, forwarded = self.received.pop(0)
            log.info("worker_processes_stopping", signal=signal.Signals(signum).name, forwarded=forwarded.name)

    def _start(self, child: _Child) -> None:
        """Forks `child`. A stop signal is held back across the fork, so that it can neither reach
        the new child while it still has the supervisor's handler nor pass before its pid is known;
        the child unblocks it once its own handlers are the defaults."""
        read_fd, write_fd = os.pipe()
        inherited = [c.ready_fd for c in self.children if c.ready_fd is not None] + [read_fd]
        sys.stdout.flush(), sys.stderr.flush()  # or the child flushes the parent's buffered lines again
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            pid = os.fork()
            if pid == 0:
                _run_forked(self.run_child, child.name, write_fd, inherited)
            os.close(write_fd)
            os.set_blocking(read_fd, False)
            child.pid, child.ready_fd, child.ready, child.started_at = pid, read_fd, False, time.monotonic()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        log.info("worker_process_started", node=child.name, pid=pid)
        if self.stops:  # a stop that came in on another thread while this one forked
            child.signal(self._forwarded())

    def run(self) -> int:
        """Starts every child, keeps them running until a signal (or a child that cannot start),
        and returns the exit code once all have exited."""
        previous = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        try:
            for child in self.children:
                if not self.stops:
                    self._start(child)
            while True:
                self._log_received()
                self._look_after_children()
                if not any(child.running() for child in self.children) and (self.stops or self.failed):
                    break
                time.sleep(POLL_S)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return 1 if self.failed else 0

    def _look_after_children(self) -> None:
        for child in self.children:
            code = child.exit_code() if child.running() else None
            if self.stops or self.failed:
                continue
            if code is not None:
                self._count_death(child, code)
            if not child.running() and not self.failed and time.monotonic() - child.started_at >= RESTART_INTERVAL_S:
                self._start(child)

    def _count_death(self, child: _Child, code: int) -> None:
        if child.ready:
            log.warning("worker_process_exited", node=child.name, exit_code=code, ready=True)
            return
        child.boot_failures += 1
        log.warning("worker_process_exited", node=child.name, exit_code=code, ready=False,
                    boot_failures=child.boot_failures)
        if child.boot_failures >= MAX_BOOT_FAILURES:
            log.error("worker_process_cannot_start", node=child.name, boot_failures=child.boot_failures)
            self.failed = True
            for other in self.children:
                other.signal(signal.SIGTERM)
