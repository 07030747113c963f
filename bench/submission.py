"""A 10,000-job batch through the API: how long until it is accepted, and what it costs in Redis.

`GroundedClient.submit` posts the batch as JSON to the API over HTTP (uvicorn on 127.0.0.1); the
API validates every line, stores the batch and its jobs, enqueues one task per job and answers
201. No worker runs, so every job is still queued when Redis memory is read: the delta of INFO
used_memory across the submission, per job, is what a queued job costs (its record, its id in
the batch list, its queue message, its share of the events stream). Goal: accepted ≤ 2 s.

Run: `.venv/bin/python -m bench.submission`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench import infra
from bench.table import median, row
from worker.store.keys import queue_lanes

JOBS = 10_000
REPEATS = 3
GOAL_S = 2.0
CONFIG: dict[str, Any] = {
    "agent": {
        "model": "extractive",
        "instructions": "Answer from the knowledge base.",
        "capabilities": [{"PassageSearchCapability": {"corpus": infra.CORPUS}}, "CitationPolicyCapability"],
    }
}


def lines(tag: str) -> list[dict[str, Any]]:
    return [{"custom_id": f"{tag}-{i:05}", "question": f"When does the observatory open on day {i}?",
             "metadata": {"answerable": True}} for i in range(JOBS)]


def run() -> list[dict[str, Any]]:
    from worker.client import GroundedClient

    seconds: list[float] = []
    per_job: list[float] = []
    with infra.temporary_folder("bench-submission-") as tmp:
        folder = Path(tmp)
        data = infra.data_dir(folder)
        with infra.private_redis(folder) as server:
            prefix = infra.new_prefix()
            api = infra.start_api(infra.settings_for(server.url, prefix, data))
            try:
                with GroundedClient(api.base_url, infra.API_TOKEN, timeout=120) as client:
                    client.submit(lines("warmup")[:100], CONFIG)
                    for r in range(REPEATS):
                        batch_lines = lines(f"r{r}")
                        before = server.used_memory()
                        start = time.perf_counter()
                        accepted = client.submit(batch_lines, CONFIG)
                        seconds.append(time.perf_counter() - start)
                        per_job.append((server.used_memory() - before) / JOBS)
                        assert accepted["counts"]["total"] == JOBS and accepted["counts"]["queued"] == JOBS, accepted
                        queued = sum(server.client().llen(prefix + lane) for lane in queue_lanes())
                        assert queued >= JOBS, f"only {queued} messages queued"
            finally:
                api.stop()
    return [
        row(f"submission: {JOBS:,}-job batch through the API, time to accepted", median(seconds), "s", GOAL_S,
            note=f"{JOBS / median(seconds):,.0f} jobs/s; runs {', '.join(f'{s:.2f}' for s in seconds)} s"),
        row("↳ Redis memory per queued job (INFO used_memory delta)", median(per_job), "bytes", digits=0),
    ]


if __name__ == "__main__":
    from bench.table import print_run

    print_run(run)
