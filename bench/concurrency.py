"""How close one worker process gets to its ideal throughput when the model is slow.

A fake OpenAI-compatible server on 127.0.0.1 answers every request after LATENCY_S (search with
the question, then cite the first chunk shown, then answer: three requests a job). One real worker
process, threads pool with C threads, runs batches of 64 and 256 jobs. Ideal throughput is C jobs
per job latency (C / (3 × LATENCY_S)); measured is jobs / (batch accepted → batch finished), the
batch submitted straight to the store and queue so submission is not timed. Goal: ≥ 90 % of ideal
at C = 64.

Run: `.venv/bin/python -m bench.concurrency`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench import infra
from bench.table import median, row

LATENCY_S = 0.2
REQUESTS_PER_JOB = 3
RUNS = ((16, 64), (16, 256), (64, 64), (64, 256))  # (concurrency, jobs)
GOAL_PERCENT = 90.0
GOAL_AT = 64
POLL_S = 0.02


def config(base_url: str) -> dict[str, Any]:
    return {
        "agent": {
            "model": "fake-model",
            "instructions": "Answer from the knowledge base.",
            "capabilities": [{"PassageSearchCapability": {"corpus": infra.CORPUS}}, "CitationPolicyCapability"],
        },
        "endpoint": {"base_url": base_url},
        "run": {"retries": 0, "timeout_s": 120},
    }


def run_batch(producer: Any, n: int, cfg: dict[str, Any], tag: str) -> float:
    """Seconds from the batch being accepted to its last job finishing; every job must succeed."""
    lines = [{"custom_id": f"{tag}-{i}", "question": f"When does the observatory open? ({tag} {i})"} for i in range(n)]
    report = producer.validate(lines, cfg)
    assert report.ok, [e.as_dict() for e in report.errors]
    batch = producer.submit(report, tenant=infra.TENANT)
    start = time.perf_counter()
    deadline = start + 300
    while True:
        progress = producer.store.progress(batch.id)
        if progress.finished:
            break
        if time.perf_counter() > deadline:
            raise TimeoutError(f"batch {tag} not finished: {progress}")
        time.sleep(POLL_S)
    elapsed = time.perf_counter() - start
    if progress.failed:
        failure = next(r for r in producer.store.iter_results(batch.id) if r.status == "failed")
        raise RuntimeError(f"{progress.failed} of {n} jobs failed, e.g. {failure.error}")
    return elapsed


def cpu_seconds(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def run() -> list[dict[str, Any]]:
    from worker.producer import Producer

    rows: list[dict[str, Any]] = []
    cpu: list[float] = []
    fake = infra.SlowFakeOpenAI(LATENCY_S).start()
    try:
        with infra.temporary_folder("bench-concurrency-") as tmp:
            folder = Path(tmp)
            data = infra.data_dir(folder)
            cfg = config(fake.base_url)
            with infra.private_redis(folder) as server:
                for concurrency in sorted({c for c, _ in RUNS}):
                    prefix = infra.new_prefix()
                    env = infra.worker_env(server.url, prefix, data, GROUNDED_CONCURRENCY=str(concurrency))
                    producer = Producer(infra.settings_for(server.url, prefix, data))
                    workers = infra.start_workers(env, folder, concurrency=concurrency)
                    try:
                        run_batch(producer, concurrency, cfg, f"warmup-{concurrency}")
                        for c, jobs in RUNS:
                            if c != concurrency:
                                continue
                            before = cpu_seconds(workers[0].process.pid)
                            elapsed = run_batch(producer, jobs, cfg, f"c{c}-n{jobs}")
                            cpu_ms = (cpu_seconds(workers[0].process.pid) - before) / jobs * 1000
                            throughput = jobs / elapsed
                            ideal = c / (REQUESTS_PER_JOB * LATENCY_S)
                            goal = GOAL_PERCENT if c == GOAL_AT else None
                            rows.append(row(f"concurrency: {jobs} jobs at C={c}, throughput / ideal",
                                            100 * throughput / ideal, "%", goal, better="higher",
                                            note=f"{throughput:.1f} of {ideal:.1f} jobs/s; {elapsed:.2f} s"))
                            cpu.append(cpu_ms)
                        rows.append(row(f"↳ worker process CPU per job at C={concurrency}", median(cpu[-2:]), "ms",
                                        note=f"one process is capped near {1000 / median(cpu[-2:]):.0f} jobs/s"))
                    finally:
                        infra.stop_workers(workers)
                        producer.app.close()
    finally:
        fake.stop()
    return rows


if __name__ == "__main__":
    from bench.table import print_run

    print_run(run)
