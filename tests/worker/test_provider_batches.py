"""H17: provider batch mode, end to end. Real worker processes, a real Redis and the real OpenAI SDK
(`OpenAIResponsesModel.batch_*`) against a fake OpenAI Batch API on 127.0.0.1.

The scripted model searches, cites and answers, so every question takes three agent steps: three
provider round trips, each in one provider batch shared by the jobs that made that step together.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelResponse

from tests.conftest import RedisSpace, whereabouts, worker_env
from tests.worker.conftest import FAKE_KEY, FAKE_KEY_ENV, PASSAGES, POLICY, question_config, settings_for
from tests.worker.fake_openai_batches import FAKE_ANSWER, FakeOpenAIBatches
from worker.producer import Producer
from worker.store.provider_batches import ProviderBatchStore
from worker.store.results import BatchProgress, ResultsStore
from worker.tasks.worker_process import WorkerProcess

STEPS = 3  # search, cite, answer
# short waits so a test takes seconds: a process submits what it queued 2 s after the first request
# (long enough for a loaded machine to resume every job of the step before), and checks a batch 1 s
# after submitting it, then half again as long each time, up to 2 s
BATCH_ENV = {
    "GROUNDED_BATCH_MAX_WAIT_S": "2",
    "GROUNDED_BATCH_POLL_S": "1",
    "GROUNDED_BATCH_MAX_POLL_S": "2",
    "GROUNDED_CONCURRENCY": "64",  # a slot is held only until a job's request is in a batch
    FAKE_KEY_ENV: FAKE_KEY,
}


@pytest.fixture(scope="module")
def batch_api() -> Iterator[FakeOpenAIBatches]:
    server = FakeOpenAIBatches().start()
    yield server
    server.stop()


def batch_config(server: FakeOpenAIBatches, **run: Any) -> dict[str, Any]:
    return question_config(PASSAGES, POLICY, model="gpt-4.1",
                           endpoint={"base_url": server.base_url, "api_key_env": FAKE_KEY_ENV, "api": "responses"},
                           run={"batch": True, **run})


def lines(n: int, tag: str, *, marker: str = "") -> list[dict[str, Any]]:
    return [{"custom_id": f"{tag}-{i}", "question": f"When does the observatory open?{marker} ({tag} {i})"}
            for i in range(n)]


class BatchCluster:
    """Worker processes in batch mode on one Redis space, a producer, and the fake Batch API."""

    def __init__(self, space: RedisSpace, data_dir: Path, log_dir: Path, server: FakeOpenAIBatches,
                 **overrides: str) -> None:
        self.space, self.server, self.log_dir = space, server, log_dir
        self.env = worker_env(space, data_dir, **{**BATCH_ENV, **overrides})
        self.producer = Producer(settings_for(space, data_dir))
        self.workers: list[WorkerProcess] = []

    @property
    def store(self) -> ResultsStore:
        return self.producer.store

    def start(self) -> WorkerProcess:
        from tests.conftest import start_worker

        worker = start_worker(self.env, self.log_dir)
        self.workers.append(worker)
        return worker

    def submit(self, batch_lines: list[dict[str, Any]], config: dict[str, Any]) -> str:
        report = self.producer.validate(batch_lines, config)
        assert report.ok, [e.as_dict() for e in report.errors]
        return self.producer.submit(report, tenant="tests").id

    def watch(self, batch_id: str, timeout: float, until: Callable[[BatchProgress], bool] | None = None,
              ) -> list[BatchProgress]:
        """Progress samples until the batch finishes (or `until` holds)."""
        seen: list[BatchProgress] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            progress = self.store.progress_of(batch_id)
            seen.append(progress)
            if progress.finished or (until is not None and until(progress)):
                return seen
            time.sleep(0.05)
        logs = "\n".join(w.output()[-3000:] for w in self.workers)
        raise AssertionError(f"batch {batch_id} not done in {timeout:g} s: {seen[-1]}\n"
                             f"{whereabouts(self.space, batch_id)}\n{logs}")

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.producer.app.close()


@pytest.fixture
def batch_cluster(redis_space: RedisSpace, data_dir: Path, tmp_path: Path,
                  batch_api: FakeOpenAIBatches) -> Iterator[Callable[..., BatchCluster]]:
    made: list[BatchCluster] = []

    def make(**overrides: str) -> BatchCluster:
        batch_api.reset(delay_s=float(overrides.pop("delay_s", "0.5")))
        cluster = BatchCluster(redis_space, data_dir, tmp_path, batch_api, **overrides)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


def all_events(store: ResultsStore, batch_id: str) -> list[dict[str, Any]]:
    """Every event of the batch (each delivery of a waiting job adds one), page by page."""
    events: list[dict[str, Any]] = []
    after: str | None = None
    while page := store.events(batch_id, after=after):
        events += [fields for _, fields in page]
        after = page[-1][0]
    return events


def all_in_provider_batches(store: ResultsStore, batch_id: str, n: int) -> Callable[[BatchProgress], bool]:
    """Every job's request is in a provider batch (a job counts as waiting from when it is queued)."""
    def done(progress: BatchProgress) -> bool:
        events = all_events(store, batch_id)
        return progress.waiting == n and len({e["job_id"] for e in events if e["event"] == "job_waiting"}) == n
    return done


def assert_each_job_once(store: ResultsStore, batch_id: str, n: int) -> None:
    events = all_events(store, batch_id)
    finished = Counter(e["job_id"] for e in events if e["event"] in ("job_finished", "job_cancelled"))
    assert len(finished) == n and set(finished.values()) == {1}
    assert sum(e["event"] == "batch_finished" for e in events) == 1


def test_H17a_a_batch_shares_one_provider_batch_per_step_and_holds_no_slot_while_waiting(batch_cluster) -> None:
    # resuming 40 jobs takes seconds of CPU on a loaded 2-core machine: a longer wait keeps a step together
    cluster = batch_cluster(GROUNDED_BATCH_MAX_WAIT_S="4")
    cluster.start()
    n = 40
    batch_id = cluster.submit(lines(n, "share"), batch_config(cluster.server))
    seen = cluster.watch(batch_id, timeout=90)
    final = seen[-1]
    assert (final.succeeded, final.failed, final.waiting, final.running) == (n, 0, 0, 0)
    # while the provider worked, every job was waiting and none held a worker slot
    assert any(p.waiting == n and p.running == 0 for p in seen)
    results = list(cluster.store.iter_results(batch_id))
    assert all(r.status == "succeeded" and r.turns[0].answer == FAKE_ANSWER for r in results)
    assert all(r.turns[0].citation_status == "grounded" for r in results)
    assert all(r.processing == "batch" and r.rounds == STEPS for r in results)
    assert all(len(r.provider_batches) == STEPS and len(r.turns[0].wire) == STEPS for r in results)
    assert all(r.usage.input_tokens == STEPS * 100 for r in results)
    # provider batches ~ steps, not jobs x steps; every request submitted once, none sent live
    used = {b for r in results for b in r.provider_batches}
    sizes = [b["request_counts"]["total"] for b in cluster.server.batches.values()]
    assert STEPS <= len(used) <= 2 * STEPS, sizes  # not jobs x steps (120)
    assert cluster.server.batch_requests == n * STEPS
    assert cluster.server.live_requests == 0
    assert_each_job_once(cluster.store, batch_id, n)
    events = all_events(cluster.store, batch_id)
    waits = [e for e in events if e["event"] == "job_waiting"]
    assert len({(e["job_id"], e["round"]) for e in waits}) == n * STEPS
    assert ProviderBatchStore(cluster.store).provider_batches(batch_id) == sorted(used)


def test_H17b_an_expired_batch_is_resubmitted_and_a_failed_request_fails_only_its_job(batch_cluster) -> None:
    cluster = batch_cluster()
    cluster.server.expire_batches = 1  # the first batch ends `expired` without running anything
    cluster.start()
    good, bad = lines(6, "ok"), lines(2, "bad", marker=" [batch-error]")
    batch_id = cluster.submit(good + bad, batch_config(cluster.server))
    final = cluster.watch(batch_id, timeout=90)[-1]
    assert (final.succeeded, final.failed) == (6, 2)
    by_id = {r.custom_id: r for r in cluster.store.iter_results(batch_id)}
    for line in good:
        result = by_id[line["custom_id"]]
        assert result.status == "succeeded" and result.turns[0].citation_status == "grounded"
        assert len(result.provider_batches) == STEPS  # the batches its responses came from
    for line in bad:
        error = by_id[line["custom_id"]].error
        assert error is not None and error.type == "BatchRequestFailed"
        assert "refused this input" in error.message
    # the expired batch, then the one its requests were resubmitted in, then one per later step
    assert len(ProviderBatchStore(cluster.store).provider_batches(batch_id)) == STEPS + 1
    assert cluster.server.batch_requests == 8 + 8 + 6 * (STEPS - 1)
    assert_each_job_once(cluster.store, batch_id, 8)


def test_H17c_cancel_mid_way_ends_in_seconds_and_cancels_the_provider_batch(batch_cluster) -> None:
    cluster = batch_cluster(delay_s="600", GROUNDED_BATCH_POLL_S="5", GROUNDED_BATCH_MAX_POLL_S="30")
    cluster.start()
    n = 12
    batch_id = cluster.submit(lines(n, "cancel"), batch_config(cluster.server))
    cluster.watch(batch_id, timeout=60, until=all_in_provider_batches(cluster.store, batch_id, n))
    provider_batches = ProviderBatchStore(cluster.store).provider_batches(batch_id)
    assert len(provider_batches) == 1
    cancelled_at = time.monotonic()
    cluster.producer.cancel(batch_id)
    final = cluster.watch(batch_id, timeout=30)[-1]
    assert time.monotonic() - cancelled_at < 15
    assert (final.cancelled, final.succeeded, final.waiting, final.state) == (n, 0, 0, "cancelled")
    assert cluster.server.cancelled == provider_batches
    assert cluster.server.statuses()[provider_batches[0]] == "cancelled"
    events = all_events(cluster.store, batch_id)
    assert [e["provider_batch"] for e in events if e["event"] == "provider_batch_cancelled"] == provider_batches
    assert_each_job_once(cluster.store, batch_id, n)


def test_H17d_a_provider_batch_shared_with_a_batch_still_running_is_not_cancelled(batch_cluster) -> None:
    cluster = batch_cluster(delay_s="600", GROUNDED_BATCH_MAX_WAIT_S="2")
    cluster.start()
    config = batch_config(cluster.server)
    kept = cluster.submit(lines(3, "kept"), config)
    dropped = cluster.submit(lines(3, "dropped"), config)
    cluster.watch(dropped, timeout=60, until=all_in_provider_batches(cluster.store, dropped, 3))
    cluster.watch(kept, timeout=60, until=all_in_provider_batches(cluster.store, kept, 3))
    shared = ProviderBatchStore(cluster.store).provider_batches(kept)
    assert shared == ProviderBatchStore(cluster.store).provider_batches(dropped)
    cluster.producer.cancel(dropped)
    assert cluster.watch(dropped, timeout=30)[-1].cancelled == 3
    assert cluster.server.cancelled == []
    assert cluster.store.progress_of(kept).waiting == 3


@pytest.mark.slow
def test_H17e_two_hundred_questions_on_two_worker_processes(batch_cluster) -> None:
    # starting or resuming 100 jobs takes a process seconds of CPU here: the wait spans that
    cluster = batch_cluster(delay_s="1.0", GROUNDED_BATCH_MAX_WAIT_S="8")
    cluster.start()
    cluster.start()
    n = 200
    batch_id = cluster.submit(lines(n, "big"), batch_config(cluster.server))
    seen = cluster.watch(batch_id, timeout=300)
    assert (seen[-1].succeeded, seen[-1].failed) == (n, 0)
    assert max(p.waiting for p in seen) > 2 * 64  # more jobs waiting at once than both workers have slots
    results = list(cluster.store.iter_results(batch_id))
    assert all(r.rounds == STEPS and r.turns[0].citation_status == "grounded" for r in results)
    used = {b for r in results for b in r.provider_batches}
    sizes = [b["request_counts"]["total"] for b in cluster.server.batches.values()]
    assert max(sizes) >= 90, sizes  # the first step: one batch per process
    # later steps split where a process needs longer than the wait to resume its jobs (seconds of CPU
    # each on a loaded 2-core machine), but never come near one batch per job (600)
    assert STEPS <= len(used) <= 5 * STEPS, sizes
    assert cluster.server.batch_requests == n * STEPS
    assert_each_job_once(cluster.store, batch_id, n)


@pytest.mark.slow
def test_H17f_a_worker_killed_while_its_jobs_wait_loses_nothing_and_submits_nothing_twice(batch_cluster) -> None:
    # a dead worker's countdowns come back when their leases expire (H14): about 10 + 1 s here
    cluster = batch_cluster(delay_s="4", GROUNDED_TASK_SOFT_LIMIT_S="10", GROUNDED_TASK_HARD_LIMIT_S="12",
                            GROUNDED_RETRY_MAX_S="2", GROUNDED_BATCH_MAX_POLL_S="2",
                            GROUNDED_UNACKED_RESTORE_INTERVAL_S="1")
    doomed = cluster.start()
    n = 30
    batch_id = cluster.submit(lines(n, "kill"), batch_config(cluster.server))
    cluster.watch(batch_id, timeout=60, until=all_in_provider_batches(cluster.store, batch_id, n))
    os.kill(doomed.process.pid, signal.SIGKILL)
    doomed.process.wait(timeout=5)
    cluster.start()
    final = cluster.watch(batch_id, timeout=180)[-1]
    errors = [r.error for r in cluster.store.iter_results(batch_id) if r.error]
    assert (final.succeeded, final.failed) == (n, 0), errors
    assert cluster.server.batch_requests == n * STEPS  # resumed from the saved rounds, never resubmitted
    assert_each_job_once(cluster.store, batch_id, n)


# --- at submission, and what a result reports (no worker) -----------------------------------------


@pytest.mark.parametrize(("config", "says"), [
    (question_config(PASSAGES, run={"batch": True}), "the extractive model runs on the worker"),
    (question_config(PASSAGES, model="fake", endpoint={"base_url": "http://127.0.0.1:9/v1"}, run={"batch": True}),
     "set `endpoint.api: responses`"),
    (question_config(PASSAGES, model="groq:llama-3.3-70b", run={"batch": True}), "has none here"),
    (question_config(PASSAGES, model="openai-chat:gpt-4.1", run={"batch": True}), "has none here"),
])
def test_H17g_a_model_without_a_batch_api_is_refused_at_submission(redis_space, data_dir, config, says) -> None:
    producer = Producer(settings_for(redis_space, data_dir))
    try:
        report = producer.validate(lines(1, "refused"), config)
    finally:
        producer.app.close()
    assert not report.ok
    (error,) = report.errors
    assert error.line_no == 0 and "run.batch" in error.problem and says in error.problem


@pytest.mark.parametrize("model", ["openai:gpt-4.1", "anthropic:claude-sonnet-4-5", "google:gemini-2.5-flash", "google-cloud:gemini-2.5-flash"])
def test_H17g_models_with_a_batch_api_are_accepted(redis_space, data_dir, model) -> None:
    producer = Producer(settings_for(redis_space, data_dir))
    try:
        assert producer.validate(lines(1, "ok"), question_config(PASSAGES, model=model, run={"batch": True})).ok
    finally:
        producer.app.close()


def test_H17h_a_batch_result_is_priced_at_batch_prices() -> None:
    from pydantic_ai.usage import RequestUsage

    from worker.runtime.provider_batches import cost_usd

    usage = RequestUsage(input_tokens=1_000_000, output_tokens=100_000)
    live = ModelResponse(parts=[], usage=usage, model_name="gpt-4.1", provider_name="openai")
    batched = ModelResponse(parts=[], usage=usage, model_name="gpt-4.1", provider_name="openai",
                            provider_details={"processing": "batch"})
    live_cost, batch_cost = cost_usd([live]), cost_usd([batched])
    assert live_cost is not None and batch_cost is not None
    assert batch_cost == pytest.approx(live_cost / 2)
    assert cost_usd([ModelResponse(parts=[], usage=usage, model_name="no-such-model", provider_name="nowhere")]) is None


def test_H17h_a_model_without_a_price_is_looked_up_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic_ai.usage import RequestUsage

    from worker.runtime.provider_batches import cost_usd

    lookups: list[str | None] = []
    real_cost = ModelResponse.cost

    def counted(response: ModelResponse) -> Any:
        lookups.append(response.model_name)
        return real_cost(response)

    monkeypatch.setattr(ModelResponse, "cost", counted)
    usage = RequestUsage(input_tokens=10, output_tokens=5)
    local = ModelResponse(parts=[], usage=usage, model_name="local-model-h17h", provider_name="openai",
                          provider_url="http://127.0.0.1:9/v1")
    priced = ModelResponse(parts=[], usage=usage, model_name="gpt-4.1", provider_name="openai")
    assert [cost_usd([local]), cost_usd([local, local])] == [None, None]
    assert cost_usd([priced]) is not None and cost_usd([priced]) is not None
    assert lookups == ["local-model-h17h", "gpt-4.1", "gpt-4.1"]


def test_H17i_a_conversation_in_batch_mode_commits_each_turn(batch_cluster) -> None:
    cluster = batch_cluster()
    cluster.start()
    config = question_config(PASSAGES, model="gpt-4.1", run={"batch": True},
                             endpoint={"base_url": cluster.server.base_url, "api_key_env": FAKE_KEY_ENV,
                                       "api": "responses"})
    turns = ["When does the observatory open?", "And on Sundays?"]
    batch_id = cluster.submit([{"custom_id": "talk", "turns": turns}], config)
    assert cluster.watch(batch_id, timeout=90)[-1].succeeded == 1
    [result] = cluster.store.iter_results(batch_id)
    assert [t.question_text for t in result.turns] == turns
    assert [t.answer for t in result.turns] == [FAKE_ANSWER, FAKE_ANSWER]
    # the first turn searches, cites and answers; the second (the scripted model has cited) answers
    assert result.rounds == STEPS + 1 and result.processing == "batch"
    stored = cluster.producer.conversations.load(result.conversation_id or "")
    assert stored is not None and stored.version == 2
    assert cluster.server.batch_requests == STEPS + 1
