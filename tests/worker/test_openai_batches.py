"""The OpenAI Batch API on the producer API, driven by the official `openai` client, unmodified:
upload a JSONL file, create a batch, poll it, list and cancel batches, download the output and
error files. A real API over HTTP, the session's real worker process, real Redis."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from openai import OpenAI
from openai.types import Batch
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from tests.worker.conftest import (
    FAKE_KEY_ENV,
    PASSAGES,
    POLICY,
    Cluster,
    question_config,
    serve,
    settings_for,
)
from tests.worker.fake_openai import FakeOpenAI
from worker.api.app import create_api
from worker.interfaces.openai_batch import OpenAIBatches
from worker.producer import Producer
from worker.settings import Settings
from worker.store.keys import QUEUE

TOKENS = {"tok-acme": "acme", "tok-globex": "globex", "tok-pager": "pager"}
CHAT, RESPONSES = "/v1/chat/completions", "/v1/responses"
TERMINAL = {"completed", "failed", "expired", "cancelled"}
MAX_LINES = 20
MAX_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, fake_openai: FakeOpenAI) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("configs")
    configs = {
        "handbook-qa": question_config(PASSAGES, POLICY),
        "slow-qa": question_config(PASSAGES, model="fake-model",
                                   endpoint={"base_url": fake_openai.base_url, "api_key_env": FAKE_KEY_ENV}),
        "not-allowed": question_config(PASSAGES, model="openai:gpt-4.1"),
    }
    paths = {}
    for name, config in configs.items():
        paths[name] = root / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(config))
    return paths


@pytest.fixture(scope="module")
def settings(cluster: Cluster, data_dir: Path, served: dict[str, Path]) -> Settings:
    return settings_for(cluster.space, data_dir, api_tokens=TOKENS, configs=served, default_config="handbook-qa",
                        model_allowlist=["extractive", "openai-compatible:*"], max_batch_lines=MAX_LINES,
                        max_request_bytes=MAX_BYTES)


@pytest.fixture(scope="module")
def api_url(cluster: Cluster, settings: Settings) -> Iterator[str]:
    producer = Producer(settings, store=cluster.store, app=cluster.producer.app)
    with serve(create_api(settings, producer=producer)) as url:
        yield url


def client(api_url: str, token: str) -> OpenAI:
    return OpenAI(base_url=f"{api_url}/openai/v1", api_key=token, max_retries=0)


@pytest.fixture
def acme(api_url: str) -> OpenAI:
    return client(api_url, "tok-acme")


@pytest.fixture
def globex(api_url: str) -> OpenAI:
    return client(api_url, "tok-globex")


def jsonl(lines: list[Any]) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


def chat_line(custom_id: str, *questions: str, model: str | None = "handbook-qa") -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": q} for q in questions]}
    if model is not None:
        body["model"] = model
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}


def upload(oa: OpenAI, lines: list[Any]) -> str:
    return oa.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch").id


def poll(oa: OpenAI, batch_id: str, timeout: float = 60) -> Batch:
    deadline = time.monotonic() + timeout
    while (batch := oa.batches.retrieve(batch_id)).status not in TERMINAL:
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
    return batch


def content_lines(oa: OpenAI, file_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in oa.files.content(file_id).text.splitlines()]


def queued(cluster: Cluster) -> int:
    return cluster.store.redis.llen(cluster.space.prefix + QUEUE)


def test_I1_I3_chat_completions_batch_round_trip_with_grounding(acme: OpenAI, cluster: Cluster) -> None:
    lines = [chat_line("hours", "When does the observatory open?"),
             chat_line("painter", "Who painted the Mona Lisa?"),
             chat_line("two-turns", "How large is the reflector mirror?", "When does the observatory open?")]
    uploaded = acme.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(jsonl(lines)) and uploaded.status == "processed"
    assert acme.files.retrieve(uploaded.id).filename == "requests.jsonl"

    created = acme.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h",
                                  metadata={"project": "handbook"})
    assert created.status in ("in_progress", "finalizing", "completed") and created.metadata == {"project": "handbook"}
    assert created.model == "handbook-qa" and created.request_counts is not None
    assert created.request_counts.total == 3 and created.expires_at == created.created_at + 24 * 3600

    batch = poll(acme, created.id)
    assert batch.status == "completed" and batch.completed_at and batch.finalizing_at and batch.in_progress_at
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (3, 3, 0)
    assert batch.output_file_id and batch.error_file_id is None and batch.errors is None
    assert batch.usage is not None and batch.usage.total_tokens > 0
    assert cluster.store.load_batch(batch.id) is not None  # the same id as the native batch

    output = acme.files.retrieve(batch.output_file_id)
    assert output.purpose == "batch_output"
    lines_out = content_lines(acme, batch.output_file_id)
    assert output.bytes == len(acme.files.content(batch.output_file_id).content)
    assert [line["custom_id"] for line in lines_out] == ["hours", "painter", "two-turns"]
    by_id = {line["custom_id"]: line for line in lines_out}
    for line in lines_out:
        assert line["error"] is None and line["response"]["status_code"] == 200 and line["id"].startswith("batch_req_")
        completion = ChatCompletion.model_validate(line["response"]["body"])
        assert completion.model == "handbook-qa" and completion.choices[0].message.role == "assistant"

    hours = by_id["hours"]["response"]["body"]
    assert "19:00" in hours["choices"][0]["message"]["content"]
    grounding = hours["grounding"]
    assert grounding["citation_status"] == "grounded" and grounding["violations"] == 0 and grounding["redirects"] == 0
    [citation] = grounding["citations"][:1]
    assert citation["document"] == "Oakridge Observatory Handbook" and citation["page"] == 1 and citation["chunk_id"]
    assert citation["document_id"] and citation["document_uri"].endswith("handbook.md")
    assert by_id["painter"]["response"]["body"]["grounding"]["citation_status"] == "ungrounded"
    turns = by_id["two-turns"]["response"]["body"]["grounding"]["turns"]
    assert [t["question"] for t in turns] == ["How large is the reflector mirror?", "When does the observatory open?"]
    assert "400 mm" in turns[0]["answer"] and by_id["two-turns"]["response"]["body"]["grounding"]["compactor_registered"] is False

    [result] = [r for r in cluster.store.iter_results(batch.id) if r.custom_id == "hours"]
    assert result.metadata["requested_model"] == "handbook-qa"


def test_I3_responses_endpoint_returns_response_bodies(acme: OpenAI) -> None:
    lines = [{"custom_id": "a", "method": "POST", "url": RESPONSES,
              "body": {"input": "When does the observatory open?"}},
             {"custom_id": "b", "method": "POST", "url": RESPONSES,
              "body": {"model": "handbook-qa", "input": [{"type": "message", "role": "user", "content": [
                  {"type": "input_text", "text": "How large is the reflector mirror?"}]}]}}]
    batch = poll(acme, acme.batches.create(input_file_id=upload(acme, lines), endpoint=RESPONSES,
                                           completion_window="24h").id)
    assert batch.status == "completed" and batch.output_file_id
    bodies = {line["custom_id"]: Response.model_validate(line["response"]["body"])
              for line in content_lines(acme, batch.output_file_id)}
    assert "19:00" in bodies["a"].output_text and "400 mm" in bodies["b"].output_text
    assert bodies["b"].model_extra is not None and bodies["b"].model_extra["grounding"]["citation_status"] == "grounded"


def test_I2_refused_lines_fail_the_batch_with_line_numbers_and_an_error_file(acme: OpenAI, cluster: Cluster) -> None:
    before = (queued(cluster), len(cluster.store.tenant_batches("acme", limit=1000)))
    lines = [chat_line("fine", "When does the observatory open?"),
             "{not json",
             "",
             {"method": "POST", "url": CHAT, "body": {"messages": [{"role": "user", "content": "q"}]}},
             {"custom_id": "sys", "method": "POST", "url": CHAT, "body": {"model": "handbook-qa", "messages": [
                 {"role": "system", "content": "be terse"}, {"role": "user", "content": "q"}]}},
             {**chat_line("elsewhere", "q"), "url": "/v1/embeddings"},
             chat_line("other-model", "q", model="slow-qa"),
             chat_line("tuned", "q") | {"body": {"messages": [{"role": "user", "content": "q"}], "temperature": 0}}]
    batch = acme.batches.create(input_file_id=upload(acme, lines), endpoint=CHAT, completion_window="24h")
    assert batch.status == "failed" and batch.failed_at and batch.errors and batch.errors.data
    problems = {e.line: e.message for e in batch.errors.data}
    assert sorted(problems) == [2, 4, 5, 6, 7, 8]
    assert "not valid JSON" in problems[2] and "custom_id is required" in problems[4]
    assert "system messages are not accepted" in problems[5] and "/v1/embeddings" in problems[6]
    assert "one config answers a whole batch" in problems[7] and "temperature" in problems[8]
    assert batch.request_counts is not None and batch.request_counts.total == 0 and batch.output_file_id is None
    assert batch.error_file_id
    refusals = content_lines(acme, batch.error_file_id)
    assert [(r["error"]["line"], r["custom_id"]) for r in refusals] == [
        (2, None), (4, None), (5, "sys"), (6, "elsewhere"), (7, "other-model"), (8, "tuned")]
    assert all(r["response"] is None and r["error"]["message"] == problems[r["error"]["line"]] for r in refusals)
    assert (queued(cluster), len(cluster.store.tenant_batches("acme", limit=1000))) == before
    assert acme.batches.retrieve(batch.id).status == "failed"


def test_I1_configs_are_the_operators_and_the_allowlist_applies(acme: OpenAI) -> None:
    unknown = acme.batches.create(input_file_id=upload(acme, [chat_line("x", "q", model="gpt-4o")]),
                                  endpoint=CHAT, completion_window="24h")
    assert unknown.status == "failed" and unknown.errors and unknown.errors.data
    [problem] = unknown.errors.data
    assert problem.line == 1 and problem.param == "body.model"
    assert "config 'gpt-4o' is not served here" in (problem.message or "") and "handbook-qa" in (problem.message or "")

    refused = acme.batches.create(input_file_id=upload(acme, [chat_line("x", "q", model="not-allowed")]),
                                  endpoint=CHAT, completion_window="24h")
    assert refused.status == "failed" and refused.errors and refused.errors.data
    [problem] = refused.errors.data
    assert problem.line is None and "model 'openai:gpt-4.1' is not allowed" in (problem.message or "")


def test_limits_of_the_api_apply_to_files_and_batches(acme: OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as too_large:
        acme.files.create(file=("big.jsonl", b"x" * (MAX_BYTES + 1)), purpose="batch")
    assert too_large.value.status_code == 413
    many = [chat_line(f"q{n}", "When does the observatory open?") for n in range(MAX_LINES + 1)]
    batch = acme.batches.create(input_file_id=upload(acme, many), endpoint=CHAT, completion_window="24h")
    assert batch.status == "failed" and batch.errors and batch.errors.data
    assert any(f"at most {MAX_LINES} jobs" in (e.message or "") for e in batch.errors.data)
    with pytest.raises(openai.BadRequestError, match="purpose 'fine-tune' is not accepted"):
        acme.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError, match="endpoint '/v1/embeddings' is not served here"):
        acme.batches.create(input_file_id=upload(acme, many[:1]), endpoint="/v1/embeddings", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="completion_window '1h'"):
        acme.batches.create(input_file_id=upload(acme, many[:1]), endpoint=CHAT,
                            completion_window="1h")  # type: ignore[arg-type]


def slow_lines(tag: str, n: int) -> list[dict[str, Any]]:
    return [chat_line(f"{tag}-{i}", f"[slow:{tag}{i}] When does the observatory open?", model="slow-qa")
            for i in range(n)]


def test_cancel_skips_queued_requests_into_the_error_file(acme: OpenAI) -> None:
    created = acme.batches.create(input_file_id=upload(acme, slow_lines("cx", 10)), endpoint=CHAT,
                                  completion_window="24h")
    cancelling = acme.batches.cancel(created.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    batch = poll(acme, created.id, timeout=90)
    assert batch.status == "cancelled" and batch.cancelled_at and batch.request_counts is not None
    counts = batch.request_counts
    assert counts.total == 10 and counts.completed + counts.failed == 10 and counts.failed >= 1
    assert batch.error_file_id
    skipped = content_lines(acme, batch.error_file_id)
    assert len(skipped) == counts.failed
    assert all(s["response"] is None and s["error"]["code"] == "batch_cancelled" for s in skipped)
    if counts.completed:
        assert batch.output_file_id and len(content_lines(acme, batch.output_file_id)) == counts.completed
    assert acme.batches.cancel(created.id).status == "cancelled"  # cancelling a finished batch changes nothing


def test_I4_an_expired_window_stops_the_batch_and_reports_batch_expired(
    acme: OpenAI, cluster: Cluster, settings: Settings
) -> None:
    created = acme.batches.create(input_file_id=upload(acme, slow_lines("ex", 8)), endpoint=CHAT,
                                  completion_window="24h")
    later = OpenAIBatches(Producer(settings, store=cluster.store, app=cluster.producer.app),
                          clock=lambda: time.time() + 25 * 3600)
    assert later.retrieve("acme", created.id)["status"] == "finalizing"
    deadline = time.monotonic() + 90
    while (batch := acme.batches.retrieve(created.id)).status != "expired":
        assert batch.status == "finalizing" and time.monotonic() < deadline, batch
        time.sleep(0.2)
    assert batch.expired_at and batch.error_file_id and batch.request_counts is not None
    expired = [line for line in content_lines(acme, batch.error_file_id) if line["error"]]
    assert expired and all(line["error"]["code"] == "batch_expired" for line in expired)


def test_list_pages_with_a_cursor_newest_first(api_url: str) -> None:
    fresh = client(api_url, "tok-pager")  # a token of its own: its tenant has only these batches
    ids = []
    for n in range(3):
        batch = fresh.batches.create(input_file_id=upload(fresh, [chat_line(f"p{n}", "When does the observatory open?")]),
                                     endpoint=CHAT, completion_window="24h")
        ids.append(batch.id)
        time.sleep(0.01)
    first = fresh.batches.list(limit=2)
    assert [b.id for b in first.data] == ids[::-1][:2] and first.has_more
    second = first.get_next_page()
    assert [b.id for b in second.data] == ids[:1] and not second.has_more
    assert [b.id for b in fresh.batches.list(limit=2)] == ids[::-1]  # auto-paging follows `after`
    with pytest.raises(openai.BadRequestError, match="after 'batch_nope'"):
        fresh.batches.list(after="batch_nope")


def test_I5_another_tenants_files_and_batches_are_not_found(acme: OpenAI, globex: OpenAI, api_url: str) -> None:
    file_id = upload(acme, [chat_line("mine", "When does the observatory open?")])
    batch = poll(acme, acme.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h").id)
    assert batch.output_file_id
    for call in (lambda: globex.files.retrieve(file_id), lambda: globex.files.content(file_id),
                 lambda: globex.files.content(batch.output_file_id or ""),
                 lambda: globex.batches.retrieve(batch.id), lambda: globex.batches.cancel(batch.id),
                 lambda: globex.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")):
        with pytest.raises(openai.NotFoundError, match="not found"):
            call()
    assert batch.id not in [b.id for b in globex.batches.list()]
    with pytest.raises(openai.AuthenticationError):
        client(api_url, "tok-wrong").batches.list()
