"""Provider batch mode (H17) against live requests: the same batch, run both ways in one run.

One real worker process (threads pool) answers the same questions with the same config twice: live,
through the Responses API (each request takes LIVE_LATENCY_S), and with `run.batch: true`, through
the OpenAI Batch API (each provider batch completes BATCH_DELAY_S after it was created). Both go
through the real OpenAI SDK to tests/worker/fake_openai_batches.py on 127.0.0.1. Reported, side by
side: provider requests, provider batches, the worker's CPU per job, and worker-slot-seconds held
(the number of jobs holding a slot, sampled every SAMPLE_S and integrated over the batch). The
scripted model searches, cites and answers: three steps, so three provider round trips per question.

Run: `.venv/bin/python -m bench.provider_batch`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench import infra
from bench.table import row

JOBS = 60
CONCURRENCY = 64  # batch mode: the default batching wait (5 s), polls every 4 s and up to 8 s
LIVE_LATENCY_S = 1.0
BATCH_DELAY_S = 10.0  # hours at a real provider; the point is that no slot is held meanwhile
SAMPLE_S = 0.05
KEY_ENV = "GROUNDED_BENCH_FAKE_KEY"


def config(base_url: str, *, batch: bool) -> dict[str, Any]:
    return {
        "agent": {
            "model": "gpt-4.1",
            "instructions": "Answer from the knowledge base.",
            "capabilities": [{"PassageSearchCapability": {"corpus": infra.CORPUS}}, "CitationPolicyCapability"],
        },
        "endpoint": {"base_url": base_url, "api_key_env": KEY_ENV, "api": "responses"},
        "run": {"batch": batch, "retries": 3, "timeout_s": 300},
    }


def measure(producer: Any, worker: Any, server: Any, *, batch: bool) -> dict[str, float]:
    """Submits the batch, samples how many jobs hold a slot until it finishes, and reads the counts."""
    from bench.scale_out import cpu_seconds

    server.reset(delay_s=BATCH_DELAY_S)
    tag = "batch" if batch else "live"
    lines = [{"custom_id": f"{tag}-{i}", "question": f"When does the observatory open? ({tag} {i})"}
             for i in range(JOBS)]
    report = producer.validate(lines, config(server.base_url, batch=batch))
    assert report.ok, [e.as_dict() for e in report.errors]
    cpu_before = cpu_seconds([worker])
    submitted = producer.submit(report, tenant=infra.TENANT)
    start = last = time.perf_counter()
    slot_seconds = waiting_seconds = 0.0
    while True:
        progress = producer.store.progress_of(submitted.id)
        now = time.perf_counter()
        slot_seconds += progress.running * (now - last)
        waiting_seconds += progress.waiting * (now - last)
        last = now
        if progress.finished:
            break
        if now - start > 300:
            raise TimeoutError(f"{tag} batch not finished: {progress}")
        time.sleep(SAMPLE_S)
    if progress.failed:
        failure = next(r for r in producer.store.iter_results(submitted.id) if r.status == "failed")
        raise RuntimeError(f"{progress.failed} of {JOBS} {tag} jobs failed, e.g. {failure.error}")
    results = list(producer.store.iter_results(submitted.id))
    return {
        "seconds": last - start,
        "requests": float(server.batch_requests if batch else server.live_requests),
        "batches": float(len({b for r in results for b in r.provider_batches})),
        "cpu_ms_per_job": 1000 * (cpu_seconds([worker]) - cpu_before) / JOBS,
        "slot_seconds": slot_seconds,
        "waiting_seconds": waiting_seconds,
        "cost_usd": sum(r.cost_usd or 0.0 for r in results),
    }


def run() -> list[dict[str, Any]]:
    from tests.worker.fake_openai_batches import FakeOpenAIBatches
    from worker.producer import Producer

    server = FakeOpenAIBatches(delay_s=BATCH_DELAY_S, live_latency_s=LIVE_LATENCY_S).start()
    try:
        with infra.temporary_folder("bench-provider-batch-") as tmp:
            folder = Path(tmp)
            data = infra.data_dir(folder)
            with infra.private_redis(folder) as redis_server:
                prefix = infra.new_prefix()
                env = infra.worker_env(redis_server.url, prefix, data, GROUNDED_CONCURRENCY=str(CONCURRENCY),
                                       GROUNDED_BATCH_MAX_WAIT_S="5", GROUNDED_BATCH_POLL_S="4",
                                       GROUNDED_BATCH_MAX_POLL_S="8",
                                       GROUNDED_ENDPOINT_KEY_BINDINGS=f"{KEY_ENV}=http://127.0.0.1:*",
                                       **{KEY_ENV: "sk-bench"})
                settings = infra.settings_for(redis_server.url, prefix, data)
                producer = Producer(settings)
                (worker,) = infra.start_workers(env, folder, n=1, concurrency=CONCURRENCY)
                try:
                    measure(producer, worker, server, batch=False)  # warm-up: imports, agent and model caches
                    live = measure(producer, worker, server, batch=False)
                    batched = measure(producer, worker, server, batch=True)
                finally:
                    infra.stop_workers([worker])
                    producer.app.close()
    finally:
        server.stop()
    note = f"{JOBS} questions x 3 steps; live requests take {LIVE_LATENCY_S:g} s, a batch {BATCH_DELAY_S:g} s"
    return [
        row("provider batch mode vs live: worker-slot-seconds held, batch / live",
            batched["slot_seconds"] / live["slot_seconds"], "×", note=note),
        row("↳ live: worker-slot-seconds held", live["slot_seconds"], "slot·s"),
        row("↳ batch: worker-slot-seconds held", batched["slot_seconds"], "slot·s",
            note="a slot is held only while a job computes, not while its request waits"),
        row("↳ batch: job-seconds waiting on the provider, holding no slot", batched["waiting_seconds"], "job·s"),
        row("↳ live: provider requests", live["requests"], "requests"),
        row("↳ batch: provider requests (in batches)", batched["requests"], "requests"),
        row("↳ live: provider batches", live["batches"], "batches"),
        row("↳ batch: provider batches", batched["batches"], "batches", note="one per agent step, shared by the jobs"),
        row("↳ live: worker CPU per job", live["cpu_ms_per_job"], "ms"),
        row("↳ batch: worker CPU per job", batched["cpu_ms_per_job"], "ms",
            note="every round is a delivery that reloads and resumes the run"),
        row("↳ live: batch time", live["seconds"], "s"),
        row("↳ batch: batch time", batched["seconds"], "s"),
        row("↳ cost by genai-prices, batch / live", batched["cost_usd"] / live["cost_usd"], "×",
            note="gpt-4.1 prices; batch results are priced at batch rates"),
    ]


if __name__ == "__main__":
    from bench.table import print_run

    print_run(run)
