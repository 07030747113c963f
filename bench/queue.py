"""One question through the whole path, against its parts measured bare.

Whole path: `GroundedClient.submit` over HTTP to the API (validate, store, enqueue) → Redis → a
real worker process (threads pool) → agent run (extractive model, passages + policy, SQLite
corpus) → results store → the client waits on the batch status (`GroundedClient.wait`: a long poll
the API answers when the batch finishes) and reads the results back over HTTP. Bare: the same agent
and model run in this process, and a Celery task that does nothing, sent and its result awaited, on
the same Redis server. The three are interleaved.
Goal (issue 16): whole path ≤ 1.2 × (agent + 2 × round trip).

Run: `.venv/bin/python -m bench.queue`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import infra
from bench.table import median, row
from capabilities.deps import Deps

ITERATIONS = 25
WARMUP = 3
GOAL = 1.2
QUESTION = "When does the observatory open?"
CONFIG: dict[str, Any] = {
    "agent": {
        "model": "extractive",
        "instructions": "Answer from the knowledge base.",
        "capabilities": [{"PassageSearchCapability": {"corpus": infra.CORPUS}}, "CitationPolicyCapability"],
    }
}


def start_noop_worker(redis_url: str, log: Path) -> tuple[subprocess.Popen[bytes], Any]:
    from bench.celery_noop import app

    name = f"noop-{uuid.uuid4().hex[:6]}@localhost"
    env = {**os.environ, "BENCH_NOOP_REDIS_URL": redis_url}
    command = [sys.executable, "-m", "celery", "-A", "bench.celery_noop", "worker", "--pool", "threads", "-c", "1",
               "-Q", "bench-noop", "-n", name, "-l", "warning", "--without-gossip", "--without-mingle",
               "--without-heartbeat"]
    with log.open("wb") as handle:
        process = subprocess.Popen(command, cwd=infra.REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
    app.conf.broker_url = app.conf.result_backend = redis_url
    deadline = time.monotonic() + 60
    while not app.control.ping(destination=[name], timeout=0.5):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"the noop worker did not start:\n{log.read_text()[-2000:]}")
    return process, app


@dataclass
class PathTiming:
    """One whole-path run, with where its time went (ms). `run` is the worker's own started_at to
    finished_at; `queued` is from the batch_submitted to the job_started event (stream ids are
    Redis-clock milliseconds)."""

    total: float
    submit: float
    observed: float
    read: float
    run: float
    queued: float


def whole_path(client: Any) -> PathTiming:
    start = time.perf_counter()
    batch = client.submit([{"custom_id": "q", "question": QUESTION}], CONFIG)
    submitted = time.perf_counter()
    assert client.wait(batch["id"], timeout=30)["state"] == "completed"
    observed = time.perf_counter()
    results = list(client.results(batch["id"]))
    done = time.perf_counter()
    result = results[0]
    assert result["status"] == "succeeded" and result["turns"][0]["citation_status"] == "grounded", result
    events = {e["event"]: int(e["id"].split("-")[0]) for e in client.events(batch["id"])}
    run = datetime.fromisoformat(result["finished_at"]) - datetime.fromisoformat(result["started_at"])
    return PathTiming(total=(done - start) * 1000, submit=(submitted - start) * 1000, observed=(observed - submitted) * 1000,
                 read=(done - observed) * 1000, run=run.total_seconds() * 1000,
                 queued=float(events["job_started"] - events["batch_submitted"]))


def bare_agent(data: Path) -> Any:
    """The agent the worker builds for this config, and the model it resolves, run here."""
    from capabilities.tags import TagSigner
    from worker.jobs.models import JobConfig
    from worker.runtime.agents import build_agent
    from worker.runtime.llms import build_model

    config = JobConfig.model_validate(CONFIG)
    built = build_agent(config, "question", signer=TagSigner([infra.TAG_KEY.encode()]), corpora_dir=data / "corpora")
    model = build_model(config)

    async def once() -> float:
        start = time.perf_counter()
        result = await built.agent.run(QUESTION, deps=Deps(state={}, conversation_id="bench"), model=model)
        elapsed = time.perf_counter() - start
        assert "19:00" in str(result.output), result.output
        return elapsed * 1000

    return once


def round_trip(app: Any) -> float:
    start = time.perf_counter()
    value = app.send_task("bench.noop", args=["x"], queue="bench-noop").get(timeout=30)
    elapsed = time.perf_counter() - start
    assert value == "x"
    return elapsed * 1000


def run() -> list[dict[str, Any]]:
    from worker.client import GroundedClient

    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(infra.temporary_folder("bench-queue-")))
        data = infra.data_dir(folder)
        server = stack.enter_context(infra.private_redis(folder))
        prefix = infra.new_prefix()
        env = infra.worker_env(server.url, prefix, data, GROUNDED_CONCURRENCY="2")
        workers = infra.start_workers(env, folder, concurrency=2)
        stack.callback(infra.stop_workers, workers)
        api = infra.start_api(infra.settings_for(server.url, prefix, data))
        stack.callback(api.stop)
        noop, noop_app = start_noop_worker(server.url.rsplit("/", 1)[0] + "/2", folder / "noop.log")
        stack.callback(noop_app.close)
        stack.callback(lambda: (noop.terminate(), noop.wait(timeout=15)))
        loop = asyncio.new_event_loop()
        stack.callback(loop.close)
        agent_once = bare_agent(data)
        client = stack.enter_context(GroundedClient(api.base_url, infra.API_TOKEN))
        steps: list[Callable[[], Any]] = [
            lambda: whole_path(client),
            lambda: loop.run_until_complete(agent_once()),
            lambda: round_trip(noop_app),
        ]
        for _ in range(WARMUP):
            for step in steps:
                step()
        measured: list[list[Any]] = [[], [], []]
        for i in range(ITERATIONS):
            for k in range(len(steps)):
                j = (i + k) % len(steps)
                measured[j].append(steps[j]())
        paths, agent_ms, trip_ms = measured
    full, agent, trip = median([p.total for p in paths]), median(agent_ms), median(trip_ms)
    goal = agent + 2 * trip

    def part(name: str) -> float:
        return median([getattr(p, name) for p in paths])

    return [
        row("queue: one question, whole path vs agent + 2 × round trip", full / goal, "×", GOAL,
            note=f"{full:.1f} ms vs {agent:.1f} + 2 × {trip:.1f} ms"),
        row("↳ whole path (submit → worker → results read back)", full, "ms"),
        row("↳ bare agent run, in-process", agent, "ms"),
        row("↳ bare Celery task round trip, same Redis", trip, "ms"),
        row("↳ whole path: submit (HTTP → validate → store → enqueue → 201)", part("submit"), "ms"),
        row("↳ whole path: batch submitted → job started (Redis clock)", part("queued"), "ms"),
        row("↳ whole path: job started → finished (in the worker)", part("run"), "ms"),
        row("↳ whole path: accepted → completion seen (client.wait, a long poll)", part("observed"), "ms"),
        row("↳ whole path: results read back over HTTP", part("read"), "ms"),
    ]


if __name__ == "__main__":
    from bench.table import print_run

    print_run(run)
