"""Does `grounded worker --processes 2` double throughput when the work is CPU-bound?

The supervisor of `grounded worker --processes N` (worker/tasks/supervisor.py) starts N real
worker processes (threads pool) that run the production task with a scripted model doing a fixed
amount of pure-Python work before each of its three turns (bench/cpu_worker.py), over the SQLite
corpus with passages + policy. One process cannot use more than one core for this work (the GIL),
so only processes add throughput. Rounds alternate between a supervisor of one process and one of
two, started afresh each round (start-up is not timed), on the same batch size, so drift on a
shared machine hits both alike. Goal: two processes ≥ 1.8 × one.

The development machine has 2 cores, shared with the Redis server, this process (which submits
and polls) and anything else running, so two workers can never have two whole cores.

Run: `.venv/bin/python -m bench.scale_out`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import infra
from bench.concurrency import run_batch
from bench.cpu_worker import CPU_MODEL
from bench.table import median, row

JOBS = 24
ROUNDS = 3
THREADS = 2
GOAL = 1.8
CONFIG: dict[str, Any] = {
    "agent": {
        "model": CPU_MODEL,
        "instructions": "Answer from the knowledge base.",
        "capabilities": [{"PassageSearchCapability": {"corpus": infra.CORPUS}}, "CitationPolicyCapability"],
    },
    "run": {"retries": 0, "timeout_s": 300},
}


@contextmanager
def supervised(env: dict[str, str], folder: Path, producer: Any, processes: int) -> Iterator[subprocess.Popen[bytes]]:
    """A supervisor of `processes` CPU workers, ready (every child answers a ping), stopped after."""
    from worker.tasks.supervisor import child_names

    base = f"scale-{uuid.uuid4().hex[:6]}@localhost"
    log = folder / f"{base.split('@')[0]}.log"
    with log.open("wb") as handle:
        supervisor = subprocess.Popen([sys.executable, "-m", "bench.cpu_worker", "supervise", str(processes), base,
                                       str(THREADS)], cwd=infra.REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
    try:
        names = child_names(base, processes)
        deadline = time.monotonic() + 90
        while len(producer.app.control.ping(destination=names, timeout=0.5)) < processes:
            if supervisor.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the supervised workers did not start:\n{log.read_text()[-2000:]}")
        yield supervisor
    finally:
        supervisor.send_signal(signal.SIGTERM)
        try:
            supervisor.wait(timeout=60)
        except subprocess.TimeoutExpired:
            supervisor.kill()
            supervisor.wait(timeout=10)


def cpu_seconds(supervisor: subprocess.Popen[bytes]) -> float:
    """CPU of the supervisor's worker processes (user + system)."""
    import psutil

    total = 0.0
    for child in psutil.Process(supervisor.pid).children(recursive=True):
        times = child.cpu_times()
        total += times.user + times.system
    return total


def timed_round(producer: Any, supervisor: subprocess.Popen[bytes], tag: str) -> tuple[float, float]:
    """Batch seconds, and the cores the workers used meanwhile (CPU seconds / wall seconds)."""
    run_batch(producer, 2 * THREADS * 2, CONFIG, f"{tag}-warmup")
    before = cpu_seconds(supervisor)
    elapsed = run_batch(producer, JOBS, CONFIG, tag)
    return elapsed, (cpu_seconds(supervisor) - before) / elapsed


def run() -> list[dict[str, Any]]:
    from worker.producer import Producer

    results: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    with infra.temporary_folder("bench-scale-") as tmp:
        folder = Path(tmp)
        data = infra.data_dir(folder)
        with infra.private_redis(folder) as server:
            prefix = infra.new_prefix()
            env = infra.worker_env(server.url, prefix, data, GROUNDED_CONCURRENCY=str(THREADS))
            producer = Producer(infra.settings_for(server.url, prefix, data))
            try:
                for r in range(ROUNDS):
                    for processes in ((1, 2) if r % 2 == 0 else (2, 1)):
                        with supervised(env, folder, producer, processes) as supervisor:
                            results[processes].append(timed_round(producer, supervisor, f"p{processes}-{r}"))
            finally:
                producer.app.close()
    t1, t2 = median([t for t, _ in results[1]]), median([t for t, _ in results[2]])
    cores1, cores2 = median([c for _, c in results[1]]), median([c for _, c in results[2]])
    load = os.getloadavg()[0]
    return [
        row("scale-out: `--processes 2` vs `--processes 1`, CPU-bound jobs", t1 / t2, "×", GOAL, better="higher",
            note=f"{JOBS / t1:.1f} vs {JOBS / t2:.1f} jobs/s; 2 cores shared, load {load:.1f}"),
        row("↳ one process: batch time", t1, "s"),
        row("↳ two processes: batch time", t2, "s"),
        row("↳ throughput per core used, two processes vs one", (t1 * cores1) / (t2 * cores2), "×",
            note="1.00 is linear scaling in the cores the workers actually got"),
        row("↳ cores the workers got, one process", cores1, "cores"),
        row("↳ cores the workers got, two processes", cores2, "cores",
            note="the rest of the 2 went to Redis, this process and other load"),
    ]


if __name__ == "__main__":
    from bench.table import print_run

    print_run(run)
