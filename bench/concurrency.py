"""One worker process against a bare pydantic-ai agent, on a slow model, at C = 16 and 64.

A fake OpenAI-compatible server on 127.0.0.1 answers every request after LATENCY_S (search with
the question, then cite the first chunk shown, then answer: three requests a job). One real worker
process, threads pool with C threads, runs batches of JOBS jobs, submitted straight to the store
and queue (submission is not timed: accepted → batch finished). The bare agent
(`bench/bare_agent.py`: the OpenAI client, two plain function tools over the same corpus file, C
runs at once on one event loop, no queue) answers the same server with the same questions, in a
subprocess of its own. Rounds alternate which side goes first, so drift on a shared machine hits
both; medians. CPU is each process's own (user + system), so it is less sensitive to the machine's
other load than wall time.

A third side puts the bare agent behind a bare Celery task (`bench/celery_agent.py`: late
acknowledgement, task events, threads pool, the answer stored in one Redis hash), so the table
also says how much of the worker's difference is Celery's own price and how much is ours.

Goals (issue 16): worker CPU per job ≤ 1.15 × the bare agent's; worker throughput ≥ 0.9 × the bare
agent's at C = 16 and C = 64. Ideal throughput, C / (3 × LATENCY_S), is shown for both.

Run: `.venv/bin/python -m bench.concurrency`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import infra
from bench.celery_agent import CeleryAgent, celery_agent
from bench.table import median, row

LATENCY_S = 0.2
REQUESTS_PER_JOB = 3
CONCURRENCY = (16, 64)
JOBS = 128
ROUNDS = 3
GOAL_CPU = 1.15
GOAL_THROUGHPUT = 0.9
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


def bare_round(base_url: str, corpus_file: Path, concurrency: int, jobs: int) -> tuple[float, float]:
    """(seconds, CPU seconds) of the bare agent answering `jobs` questions, in its own process."""
    done = subprocess.run([sys.executable, "-m", "bench.bare_agent", base_url, str(corpus_file), str(concurrency),
                           str(jobs)], cwd=infra.REPO, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the bare agent failed:\n{done.stderr[-2000:]}")
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    return measured["wall_s"], measured["cpu_s"]


def worker_round(producer: Any, pid: int, cfg: dict[str, Any], jobs: int, tag: str) -> tuple[float, float]:
    before = cpu_seconds(pid)
    elapsed = run_batch(producer, jobs, cfg, tag)
    return elapsed, cpu_seconds(pid) - before


def celery_round(side: CeleryAgent, jobs: int) -> tuple[float, float]:
    before = cpu_seconds(side.process.pid)
    elapsed = side.run(jobs)
    return elapsed, cpu_seconds(side.process.pid) - before


def compare_rows(c: int, worker: list[tuple[float, float]], bare: list[tuple[float, float]],
                 queued: list[tuple[float, float]]) -> list[dict[str, Any]]:
    w_rate, b_rate = median([JOBS / s for s, _ in worker]), median([JOBS / s for s, _ in bare])
    w_cpu, b_cpu = median([cpu / JOBS * 1000 for _, cpu in worker]), median([cpu / JOBS * 1000 for _, cpu in bare])
    q_rate, q_cpu = median([JOBS / s for s, _ in queued]), median([cpu / JOBS * 1000 for _, cpu in queued])
    ideal = c / (REQUESTS_PER_JOB * LATENCY_S)
    return [
        row(f"concurrency: worker vs bare agent, CPU per job at C={c}", w_cpu / b_cpu, "×", GOAL_CPU,
            note=f"{w_cpu:.1f} vs {b_cpu:.1f} ms"),
        row(f"concurrency: worker vs bare agent, throughput at C={c}", w_rate / b_rate, "×", GOAL_THROUGHPUT,
            better="higher", note=f"{w_rate:.1f} vs {b_rate:.1f} jobs/s; {JOBS} jobs"),
        row(f"↳ worker vs the bare agent in a bare Celery task, CPU per job at C={c}", w_cpu / q_cpu, "×",
            note=f"{w_cpu:.1f} vs {q_cpu:.1f} ms; the bare Celery task alone is {q_cpu / b_cpu:.2f}× the bare agent"),
        row(f"↳ worker vs the bare agent in a bare Celery task, throughput at C={c}", w_rate / q_rate, "×",
            note=f"{w_rate:.1f} vs {q_rate:.1f} jobs/s"),
        row(f"↳ worker throughput / ideal at C={c}", 100 * w_rate / ideal, "%", note=f"ideal {ideal:.1f} jobs/s"),
        row(f"↳ bare agent throughput / ideal at C={c}", 100 * b_rate / ideal, "%"),
    ]


def run() -> list[dict[str, Any]]:
    from worker.producer import Producer

    rows: list[dict[str, Any]] = []
    fake = infra.SlowFakeOpenAI(LATENCY_S).start()
    try:
        with infra.temporary_folder("bench-concurrency-") as tmp:
            folder = Path(tmp)
            data = infra.data_dir(folder)
            corpus_file = data / "corpora" / f"{infra.CORPUS}.sqlite"
            cfg = config(fake.base_url)
            with infra.private_redis(folder) as server:
                for c in CONCURRENCY:
                    prefix = infra.new_prefix()
                    env = infra.worker_env(server.url, prefix, data, GROUNDED_CONCURRENCY=str(c))
                    producer = Producer(infra.settings_for(server.url, prefix, data))
                    workers = infra.start_workers(env, folder, concurrency=c)
                    worker: list[tuple[float, float]] = []
                    bare: list[tuple[float, float]] = []
                    queued: list[tuple[float, float]] = []
                    try:
                        with celery_agent(fake.base_url, corpus_file, server.url, c, folder / f"celery-{c}.log",
                                          poll_s=POLL_S) as q:
                            run_batch(producer, c, cfg, f"warmup-{c}")
                            for r in range(ROUNDS):
                                sides = [lambda: bare.append(bare_round(fake.base_url, corpus_file, c, JOBS)),
                                         lambda: worker.append(worker_round(producer, workers[0].process.pid, cfg,
                                                                            JOBS, f"c{c}-r{r}")),
                                         lambda: queued.append(celery_round(q, JOBS))]
                                for side in sides[r % 3 :] + sides[: r % 3]:
                                    side()
                                    fake.reset()
                    finally:
                        infra.stop_workers(workers)
                        producer.app.close()
                    rows += compare_rows(c, worker, bare, queued)
    finally:
        fake.stop()
    return rows


if __name__ == "__main__":
    from bench.table import print_run

    print_run(run)
