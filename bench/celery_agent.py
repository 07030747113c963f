"""The bare agent behind a bare Celery task: what a user would write to put `bench/bare_agent.py`
on a queue without this product, and so the floor for the worker's queue and store.

One Celery app on the same Redis, with the settings a reliable queue of long jobs needs and that
the worker also runs with (late acknowledgement, one prefetched message per slot, task events for
Flower, threads pool), and one task: run the bare agent on the process's event loop (Celery has no
async tasks, so the loop runs on a thread of its own and the task waits for its coroutine), then
store the answer and the cited chunk ids in one Redis hash. No job config, no capabilities, no
leases, no results model, no metrics, no events of our own.

`python -m bench.celery_agent BASE_URL CORPUS_FILE REDIS_URL QUEUE CONCURRENCY` runs the worker;
`celery_agent(...)` starts one and gives the producer's side, `CeleryAgent.run`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis
from celery import Celery

from bench.bare_agent import Cited, Corpus, build_agent

TASK = "bench.answer"


def results_key(queue: str) -> str:
    return f"{queue}:answers"


def create_app(redis_url: str, queue: str) -> Celery:
    app = Celery("bench-celery-agent", broker=redis_url, set_as_current=False)
    app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1, task_default_queue=queue,
                    worker_send_task_events=True, task_send_sent_event=True, task_ignore_result=True,
                    worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)
    return app


def serve(base_url: str, corpus_file: str, redis_url: str, queue: str, concurrency: int) -> None:
    app = create_app(redis_url, queue)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    agent = build_agent(base_url, Corpus(corpus_file))
    store = redis.Redis.from_url(redis_url)

    @app.task(name=TASK)
    def answer(question: str) -> None:
        cited = Cited()
        result = asyncio.run_coroutine_threadsafe(agent.run(question, deps=cited), loop).result()
        store.hset(results_key(queue), question, json.dumps({"answer": result.output, "cited": cited.chunk_ids}))

    app.worker_main(["worker", "--pool", "threads", "-c", str(concurrency), "-Q", queue, "-n", f"{queue}@bench",
                     "-l", "warning", "-E", "--without-gossip", "--without-mingle"])


@dataclass
class CeleryAgent:
    process: subprocess.Popen[bytes]
    app: Celery
    client: redis.Redis
    queue: str
    poll_s: float

    def answered(self) -> int:
        return int(self.client.hlen(results_key(self.queue)))

    def run(self, jobs: int) -> float:
        """Seconds for `jobs` questions, sent at once, until every one is answered."""
        target = self.answered() + jobs
        start = time.perf_counter()
        for _ in range(jobs):
            self.app.send_task(TASK, args=[f"When does the observatory open? ({uuid.uuid4().hex})"])
        while self.answered() < target:
            if time.perf_counter() - start > 300:
                raise TimeoutError("the Celery agent did not answer in time")
            time.sleep(self.poll_s)
        return time.perf_counter() - start


@contextmanager
def celery_agent(base_url: str, corpus_file: Path, redis_url: str, concurrency: int, log: Path, *,
                 poll_s: float) -> Iterator[CeleryAgent]:
    """A worker of this module in a process of its own, ready once it answered a ping and a warm-up
    batch; stopped, and its answers deleted, after."""
    from bench import infra  # the benchmark's side only: the worker process stays bare

    queue = f"bench-celery-{uuid.uuid4().hex[:8]}"
    app = create_app(redis_url, queue)
    with log.open("wb") as handle:
        process = subprocess.Popen([sys.executable, "-m", "bench.celery_agent", base_url, str(corpus_file), redis_url,
                                    queue, str(concurrency)], cwd=infra.REPO, stdout=handle, stderr=subprocess.STDOUT)
    side = CeleryAgent(process, app, redis.Redis.from_url(redis_url), queue, poll_s)
    try:
        deadline = time.monotonic() + 60
        while not app.control.ping(destination=[f"{queue}@bench"], timeout=0.5):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Celery agent did not start:\n{log.read_text()[-2000:]}")
        side.run(concurrency)  # warm-up
        yield side
    finally:
        process.terminate()
        process.wait(timeout=30)
        side.client.delete(results_key(queue))
        side.client.close()
        app.close()


if __name__ == "__main__":
    url, path, redis_url, queue, c = sys.argv[1:6]
    serve(url, path, redis_url, queue, int(c))
