"""`grounded worker --processes N`: N worker processes on one host, started and stopped together.

One worker process runs all its jobs on one event loop, and Python runs that loop on one core at a
time (the GIL), so a host's other cores stay idle however many threads the process has
(docs/benchmarks.md, scale-out). The supervisor starts N children, each a whole `grounded worker
--processes 1` with its own Celery consumer, threads pool and event loop, named
`<name>-<i>@<host>` from the base node name so Flower and remote control tell them apart.

- **Stop.** The first SIGTERM or SIGINT is forwarded to every child as SIGTERM: Celery's warm
  shutdown, in which each child stops taking jobs and finishes the ones it runs, exactly as one
  process does. A second one forwards SIGQUIT, Celery's cold shutdown: running jobs are left
  unacknowledged and come back when their leases expire (H14), as when one process is killed. The
  supervisor exits once every child has.
- **Recovery.** A child that exits on its own (a crash, an out-of-memory kill) is started again
  after RESTART_DELAY_S; the jobs it held come back to the queue the way a lost worker's always do.
  A child that dies MAX_RESTARTS times within RESTART_WINDOW_S is a broken host or configuration,
  not bad luck: the supervisor stops the others and exits with 1.
- **Children never outlive it.** They run in their own session, so a terminal's Ctrl-C reaches
  only the supervisor (which forwards it once), and on Linux the kernel sends them SIGTERM if the
  supervisor itself is killed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType

import structlog

RESTART_DELAY_S = 1.0
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
POLL_S = 0.2
_PR_SET_PDEATHSIG = 1

log = structlog.get_logger()


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
    """Runs in the child between fork and exec: SIGTERM when the supervisor dies (Linux only)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


@dataclass
class _Child:
    name: str
    command: list[str]
    process: subprocess.Popen[bytes] | None = None
    deaths: deque[float] = field(default_factory=deque)

    def start(self, env: dict[str, str] | None) -> None:
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
        self.process = subprocess.Popen(self.command, env=env, start_new_session=True, preexec_fn=preexec)  # noqa: PLW1509
        log.info("worker_process_started", node=self.name, pid=self.process.pid)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.running():
            assert self.process is not None
            try:
                self.process.send_signal(signum)
            except ProcessLookupError:
                pass


class Supervisor:
    def __init__(self, names: Sequence[str], command_for: Callable[[str], list[str]], *,
                 env: dict[str, str] | None = None) -> None:
        self.children = [_Child(name, command_for(name)) for name in names]
        self.env = env
        self.stops = 0  # signals received: 1 is a warm stop, 2 or more a cold one
        self.failed = False

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stops += 1
        forwarded = signal.SIGTERM if self.stops == 1 else signal.SIGQUIT
        log.info("worker_processes_stopping", signal=signal.Signals(signum).name,
                 forwarded=signal.Signals(forwarded).name)
        for child in self.children:
            child.signal(forwarded)

    def run(self) -> int:
        """Starts every child, keeps them running until a signal (or a child that keeps dying),
        and returns the exit code once all have exited."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for child in self.children:
                if not self.stops:
                    child.start(self.env)
            while any(child.running() for child in self.children) or (not self.stops and not self.failed):
                if not self.stops and not self.failed:
                    self._restart_exited()
                time.sleep(POLL_S)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return 1 if self.failed else 0

    def _restart_exited(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.running():
                continue
            code = child.process.returncode if child.process is not None else None
            child.deaths.append(now)
            while child.deaths and now - child.deaths[0] > RESTART_WINDOW_S:
                child.deaths.popleft()
            if len(child.deaths) >= MAX_RESTARTS:
                log.error("worker_process_keeps_dying", node=child.name, exit_code=code, deaths=len(child.deaths))
                self.failed = True
                for other in self.children:
                    other.signal(signal.SIGTERM)
                return
            log.warning("worker_process_exited", node=child.name, exit_code=code, restart_in_s=RESTART_DELAY_S)
            time.sleep(RESTART_DELAY_S)
            if self.stops:
                return
            child.start(self.env)
