"""Does a second worker process double throughput when the work is CPU-bound?

Two real worker processes (threads pool) run the production task with a scripted model that does
a fixed amount of pure-Python work before each of its three turns (bench/cpu_worker.py), over the
SQLite corpus with passages + policy. One process cannot use more than one core for this work
(the GIL), so only processes add throughput. Rounds alternate between one process consuming (the
other's consumer cancelled by remote control) and both, on the same batch size, so drift on a
shared machine hits both alike. Goal: two processes ≥ 1.8 × one.

The development machine has 2 cores, shared with the Redis server, this process (which submits
and polls) and anything else running, so two workers can never have two whole cores.

Run: `.venv/bin/python -m bench.scale_out`.
"""

from __future__ import annotations

import os
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


def set_consuming(app: Any, worker: Any, on: bool) -> None:
    from worker.store.keys import QUEUE

    if on:
        replies = app.control.add_consumer(QUEUE, destination=[worker.name], reply=True, timeout=5)
    else:
        replies = app.control.cancel_consumer(QUEUE, destination=[worker.name], reply=True, timeout=5)
    if not replies:
        raise RuntimeError(f"{worker.name} did not answer {'add' if on else 'cancel'}_consumer")


def cpu_seconds(workers: list[Any]) -> float:
    import psutil

    total = 0.0
    for worker in workers:
        times = psutil.Process(worker.process.pid).cpu_times()
        total += times.user + times.system
    return total


def timed_round(producer: Any, workers: list[Any], tag: str) -> tuple[float, float]:
    """Batch seconds, and the cores the workers used meanwhile (CPU seconds / wall seconds)."""
    before = cpu_seconds(workers)
    elapsed = run_batch(producer, JOBS, CONFIG, tag)
    return elapsed, (cpu_seconds(workers) - before) / elapsed


def run() -> list[dict[str, Any]]:
    from worker.producer import Producer

    with infra.temporary_folder("bench-scale-") as tmp:
        folder = Path(tmp)
        data = infra.data_dir(folder)
        with infra.private_redis(folder) as server:
            prefix = infra.new_prefix()
            env = infra.worker_env(server.url, prefix, data, GROUNDED_CONCURRENCY=str(THREADS))
            producer = Producer(infra.settings_for(server.url, prefix, data))
            workers = infra.start_cpu_workers(env, folder, n=2, concurrency=THREADS)
            one: list[tuple[float, float]] = []
            two: list[tuple[float, float]] = []
            try:
                run_batch(producer, 2 * THREADS * 2, CONFIG, "warmup")
                for r in range(ROUNDS):
                    set_consuming(producer.app, workers[1], False)
                    one.append(timed_round(producer, workers, f"one-{r}"))
                    set_consuming(producer.app, workers[1], True)
                    two.append(timed_round(producer, workers, f"two-{r}"))
            finally:
                infra.stop_workers(workers)
                producer.app.close()
    t1, t2 = median([t for t, _ in one]), median([t for t, _ in two])
    cores1, cores2 = median([c for _, c in one]), median([c for _, c in two])
    load = os.getloadavg()[0]
    return [
        row("scale-out: 2 worker processes vs 1, CPU-bound jobs", t1 / t2, "×", GOAL, better="higher",
            note=f"{JOBS / t1:.1f} vs {JOBS / t2:.1f} jobs/s; 2 cores shared, load {load:.1f}"),
        row("↳ one process: batch time", t1, "s"),
        row("↳ two processes: batch time", t2, "s"),
        row("↳ throughput per core used, two processes vs one", (t1 * cores1) / (t2 * cores2), "×",
            note="1.00 is linear scaling in the cores the workers actually got"),
        row("↳ cores the workers got, one process consuming", cores1, "cores"),
        row("↳ cores the workers got, two processes consuming", cores2, "cores",
            note="the rest of the 2 went to Redis, this process and other load"),
    ]


if __name__ == "__main__":
    from bench.table import print_run

    print_run(run)
