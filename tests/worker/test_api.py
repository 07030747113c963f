"""The producer API over HTTP (uvicorn on 127.0.0.1) through the Python client, with the session worker."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx2
import pytest

from tests.worker.conftest import (
    PASSAGES,
    POLICY,
    Cluster,
    question_config,
)
from worker.client import APIError, BatchRejected, GroundedClient, NotFound
from worker.jobs.lines import parse_batch
from worker.jobs.models import Batch, Job, JobResult
from worker.store.keys import QUEUE
from worker.store.results import STREAM_ID_PART_MAX, event_id_after


@pytest.fixture
def acme(api_url: str) -> Iterator[GroundedClient]:
    with GroundedClient(api_url, "tok-acme") as client:
        yield client


@pytest.fixture
def globex(api_url: str) -> Iterator[GroundedClient]:
    with GroundedClient(api_url, "tok-globex") as client:
        yield client


def queue_length(cluster: Cluster) -> int:
    return cluster.store.redis.llen(cluster.space.prefix + QUEUE)


def test_submit_wait_and_stream_results(acme: GroundedClient) -> None:
    lines = [{"custom_id": "hours", "question": "When does the observatory open?"},
             {"custom_id": "none", "question": "Who painted the Mona Lisa?"}]
    accepted = acme.submit(lines, question_config(PASSAGES, POLICY), arm="on")
    assert accepted["counts"]["total"] == 2 and accepted["arm"] == "on"
    final = acme.wait(accepted["id"], timeout=30)
    assert final["counts"]["succeeded"] == 2 and final["state"] == "completed"
    results = list(acme.results(accepted["id"]))
    assert [r["custom_id"] for r in results] == ["hours", "none"]
    assert [r["turns"][0]["citation_status"] for r in results] == ["grounded", "ungrounded"]
    assert all(r["arm"] == "on" for r in results)
    job = acme.job(results[0]["job_id"])
    assert job["state"] == "succeeded" and job["result"]["turns"][0]["cited"]


def test_jsonl_upload_with_a_yaml_config(acme: GroundedClient, tmp_path: Path) -> None:
    path = tmp_path / "questions.jsonl"
    path.write_text(json.dumps({"custom_id": "mirror", "question": "How large is the reflector mirror?"}) + "\n")
    config = "agent:\n  model: extractive\n  capabilities:\n    - PassageSearchCapability: {corpus: handbook}\n"
    accepted = acme.submit_file(path, config)
    acme.wait(accepted["id"], timeout=30)
    [result] = acme.results(accepted["id"])
    assert "400 mm" in result["turns"][0]["answer"]


@pytest.mark.parametrize("config_part", ["file", "text"], ids=["curl -F config=@job.yaml", "curl -F config=<job.yaml"])
def test_multipart_config_may_be_a_file_part_or_a_text_part(api_url: str, config_part: str, tmp_path: Path) -> None:
    lines = json.dumps({"custom_id": "mirror", "question": "How large is the reflector mirror?"}) + "\n"
    config = "agent:\n  model: extractive\n  capabilities:\n    - PassageSearchCapability: {corpus: handbook}\n"
    files = {"file": ("questions.jsonl", lines.encode(), "application/x-ndjson")}
    data = {}
    if config_part == "file":
        files["config"] = ("job.yaml", config.encode(), "application/octet-stream")
    else:
        data["config"] = config
    response = httpx2.post(f"{api_url}/v1/batches", files=files, data=data,
                           headers={"Authorization": "Bearer tok-acme"}, timeout=30)
    assert response.status_code == 201, response.text
    with GroundedClient(api_url, "tok-acme") as client:
        client.wait(response.json()["id"], timeout=30)
        [result] = client.results(response.json()["id"])
    assert "400 mm" in result["turns"][0]["answer"]


def test_multipart_without_a_config_part_names_what_is_missing(api_url: str) -> None:
    files = {"file": ("questions.jsonl", b'{"custom_id": "a", "question": "q"}\n', "application/x-ndjson")}
    response = httpx2.post(f"{api_url}/v1/batches", files=files, headers={"Authorization": "Bearer tok-acme"})
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["line"] == 0 and "no `config` part" in error["problem"] and "config=@job.yaml" in error["problem"]


def test_docs_are_served_without_a_cdn(api_url: str) -> None:
    """/docs and /redoc load every script, style and icon from the API itself, so they work offline."""
    for page in ("/docs", "/redoc"):
        html = httpx2.get(f"{api_url}{page}").text
        assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
        assert assets, html
        for asset in assets:
            assert asset.startswith("/") and not asset.startswith("//"), f"{page} loads {asset} from elsewhere"
            assert httpx2.get(f"{api_url}{asset}").status_code == 200, asset
        assert "cdn." not in html and "fonts.googleapis" not in html
    assert '"validatorUrl": null' in httpx2.get(f"{api_url}/docs").text


def test_a_rejected_batch_reports_lines_and_enqueues_nothing(acme: GroundedClient, cluster: Cluster) -> None:
    before = (queue_length(cluster), acme.batches())
    lines = [{"custom_id": "ok", "question": "fine"}, "{broken", {"custom_id": "ok", "question": "dup"}]
    with pytest.raises(BatchRejected) as rejected:
        acme.submit(lines, question_config({"PassageSearchCapability": {"corpus": "../../etc"}}))
    errors = rejected.value.errors
    assert [e["line"] for e in errors] == [0, 2, 3]
    assert "is not a corpus name" in errors[0]["problem"] and errors[1]["problem"].startswith("not valid JSON")
    assert (queue_length(cluster), acme.batches()) == before


def test_unknown_capability_is_a_422_naming_the_allowed_types(acme: GroundedClient) -> None:
    with pytest.raises(BatchRejected) as rejected:
        acme.submit([{"custom_id": "a", "question": "q"}], question_config("LocalWorkspace"))
    [error] = rejected.value.errors
    assert error["line"] == 0 and "capability 'LocalWorkspace' is not allowed here" in error["problem"]


def test_two_tenants_cannot_see_each_others_batches(acme: GroundedClient, globex: GroundedClient) -> None:
    batch = acme.submit([{"custom_id": "a", "question": "When does the observatory open?"}],
                        question_config(PASSAGES))
    acme.wait(batch["id"], timeout=30)
    [result] = acme.results(batch["id"])
    for attempt in (lambda: globex.status(batch["id"]), lambda: list(globex.results(batch["id"])),
                    lambda: globex.cancel(batch["id"]), lambda: globex.job(result["job_id"]),
                    lambda: globex.events(batch["id"])):
        with pytest.raises(NotFound):
            attempt()
    assert batch["id"] not in [b["id"] for b in globex.batches()]
    assert batch["id"] in [b["id"] for b in acme.batches()]


def test_requests_without_a_valid_token_are_refused(api_url: str) -> None:
    assert httpx2.get(f"{api_url}/v1/batches").status_code == 401
    assert httpx2.get(f"{api_url}/v1/batches", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert httpx2.get(f"{api_url}/healthz").json() == {"status": "ok"}


def test_cancel_is_accepted_and_reported(acme: GroundedClient) -> None:
    batch = acme.submit([{"custom_id": "a", "question": "When does the observatory open?"}], question_config(PASSAGES))
    cancelled = acme.cancel(batch["id"])
    assert cancelled["state"] in ("cancelling", "cancelled", "completed")
    final = acme.wait(batch["id"], timeout=30)
    assert final["counts"]["succeeded"] + final["counts"]["cancelled"] == 1
    assert any(e["event"] == "batch_cancel_requested" for e in acme.events(batch["id"]))


def test_openapi_lists_the_routes(api_url: str) -> None:
    paths = httpx2.get(f"{api_url}/openapi.json").json()["paths"]
    assert {"/v1/batches", "/v1/batches/{batch_id}", "/v1/batches/{batch_id}/results",
            "/v1/batches/{batch_id}/cancel", "/v1/jobs/{job_id}", "/healthz"} <= set(paths)
    assert "multipart/form-data" in paths["/v1/batches"]["post"]["requestBody"]["content"]


def test_events_page_after_an_id_and_refuse_ids_redis_cannot_hold(acme: GroundedClient, api_url: str) -> None:
    """Event ids are two 64-bit parts; a larger part is the caller's mistake (422), never a 500."""
    accepted = acme.submit([{"custom_id": "e", "question": "When does the observatory open?"}],
                           question_config(PASSAGES))
    acme.wait(accepted["id"], timeout=30)
    events = acme.events(accepted["id"])
    assert len(events) >= 2
    assert events[0]["event"] == "batch_submitted" and events[0]["total"] == 1   # a number, not "1"
    assert acme.events(accepted["id"], after=events[0]["id"]) == events[1:]
    assert acme.events(accepted["id"], after=events[-1]["id"]) == []
    largest = f"{STREAM_ID_PART_MAX}-{STREAM_ID_PART_MAX}"
    assert acme.events(accepted["id"], after=largest) == []
    for bad in ("19118683660616080163-1", f"1-{STREAM_ID_PART_MAX + 1}"):
        response = httpx2.get(f"{api_url}/v1/batches/{accepted['id']}/events", params={"after": bad},
                              headers={"Authorization": "Bearer tok-acme"})
        assert response.status_code == 422 and "out of range" in response.text


def test_event_id_after_is_the_next_id_redis_accepts() -> None:
    assert event_id_after("5-3") == "5-4"
    assert event_id_after("5") == "5-1"
    assert event_id_after(f"5-{STREAM_ID_PART_MAX}") == "6-0"
    assert event_id_after(f"{STREAM_ID_PART_MAX}-{STREAM_ID_PART_MAX}") is None
    with pytest.raises(ValueError, match="out of range"):
        event_id_after(f"{STREAM_ID_PART_MAX + 1}-0")


def unqueued_batch(cluster: Cluster, custom_id: str) -> tuple[Batch, list[Job]]:
    """A one-job batch stored but never enqueued: it finishes when the test writes its result."""
    report = parse_batch([{"custom_id": custom_id, "question": "q?"}], {"agent": {"model": "extractive"}})
    return cluster.store.create_batch(report, tenant="acme")


def test_status_with_wait_s_is_held_until_the_batch_finishes(acme: GroundedClient, cluster: Cluster) -> None:
    """A long poll: `wait` sees the end as it happens, not at its next poll."""
    batch, [job] = unqueued_batch(cluster, "held")
    start = time.monotonic()
    assert acme.status(batch.id, wait_s=0.3)["state"] == "queued"
    assert 0.3 <= time.monotonic() - start < 2

    def finish() -> None:
        time.sleep(0.3)
        now = datetime.now(UTC)
        result = JobResult(job_id=job.id, batch_id=batch.id, custom_id="held", kind="question", status="succeeded",
                           model="extractive", started_at=now, finished_at=now)
        cluster.store.write_result(result, total=1)

    finisher = threading.Thread(target=finish)
    start = time.monotonic()
    finisher.start()
    assert acme.wait(batch.id, timeout=20)["state"] == "completed"
    finisher.join()
    assert time.monotonic() - start < 2
    with pytest.raises(APIError, match="422"):
        acme.status(batch.id, wait_s=61)


def test_a_batch_deleted_during_a_long_poll_is_a_404_when_the_wait_ends(acme: GroundedClient, cluster: Cluster) -> None:
    batch, _ = unqueued_batch(cluster, "gone")
    deleter = threading.Timer(0.1, lambda: acme.delete(batch.id))
    deleter.start()
    with pytest.raises(NotFound):
        acme.status(batch.id, wait_s=0.5)
    deleter.join()
