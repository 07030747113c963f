"""GET /v1/batches/{id}/report?against={id}: the same report, served from stored results (real Redis)."""

from __future__ import annotations

import html
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from capabilities.tags import TagSigner
from tests.conftest import TEST_TAG_KEY, RedisSpace
from tests.worker.stored_results import stored, synthetic_arm, synthetic_off_arm
from worker.api.app import create_api
from worker.api.reports import reports
from worker.jobs.lines import parse_batch
from worker.producer import Producer
from worker.settings import Settings

SIGNER = TagSigner([TEST_TAG_KEY.encode()])
CONFIG = {"agent": {"model": "extractive", "capabilities": [{"PassageSearchCapability": {"corpus": "handbook"}}]}}
ON_CONFIG = {"agent": {**CONFIG["agent"], "capabilities": [*CONFIG["agent"]["capabilities"], "CitationPolicyCapability"]}}
TOKENS = {"tok-a": "tenant-a", "tok-b": "tenant-b"}


def store_arm(producer: Producer, arm: str, config: dict, results) -> str:
    """Stores a batch as the API would, then the results a worker would have written for its jobs."""
    lines = [{"custom_id": r.custom_id, "question": f"question {r.custom_id}?", "metadata": r.metadata} for r in results]
    report = parse_batch(lines, config)
    assert report.ok, report.errors
    batch, jobs = producer.store.create_batch(report, tenant="tenant-a", arm=arm)
    for job, result in zip(jobs, results, strict=True):
        producer.store.write_result(result.model_copy(update={"job_id": job.id, "batch_id": batch.id}), total=batch.total)
    return batch.id


@pytest.fixture
def api(redis_space: RedisSpace, tmp_path: Path):
    def make(**overrides):
        settings = Settings(redis_url=redis_space.url, key_prefix=redis_space.prefix, data_dir=tmp_path,
                            api_tokens=TOKENS, **{"tag_keys": [TEST_TAG_KEY], **overrides})
        producer = Producer(settings)
        app = create_api(settings, producer=producer)
        app.include_router(reports)
        return TestClient(app), producer

    return make


def test_report_endpoint_serves_both_arms_with_the_baseline_first(api):
    client, producer = api()
    off = store_arm(producer, "off", CONFIG, synthetic_off_arm(signer=SIGNER))
    on = store_arm(producer, "on", ON_CONFIG, synthetic_arm(signer=SIGNER))
    response = client.get(f"/v1/batches/{on}/report", params={"against": off},
                          headers={"Authorization": "Bearer tok-a"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/html")
    page = response.text
    assert "<table id=metrics>" in page and page.count("<svg") == 2
    assert html.escape("<th>on − off</th>") not in page and "<th>on − off</th>" in page
    assert "n/a (no policy)" in page  # violations for the arm without the policy
    assert off in page and on in page


def test_report_endpoint_reports_one_batch_alone(api):
    client, producer = api()
    on = store_arm(producer, "on", ON_CONFIG, synthetic_arm(signer=SIGNER))
    response = client.get(f"/v1/batches/{on}/report", headers={"Authorization": "Bearer tok-a"})
    assert response.status_code == 200, response.text
    assert "<table id=questions>" in response.text and " − " not in response.text.split("<table id=metrics>")[1][:300]


def test_report_endpoint_hides_other_tenants_batches(api):
    client, producer = api()
    on = store_arm(producer, "on", ON_CONFIG, synthetic_arm(signer=SIGNER))
    assert client.get(f"/v1/batches/{on}/report", headers={"Authorization": "Bearer tok-b"}).status_code == 404
    assert client.get(f"/v1/batches/{on}/report").status_code == 401
    mine = store_arm(producer, "off", CONFIG, synthetic_off_arm(signer=SIGNER))
    other = client.get(f"/v1/batches/{mine}/report", params={"against": on}, headers={"Authorization": "Bearer tok-b"})
    assert other.status_code == 404


def test_V6_report_endpoint_refuses_contradicting_results_naming_the_job(api):
    client, producer = api()
    bad = stored("a9", answerable=True, status="missing", stored_status="grounded", signer=SIGNER)
    batch = store_arm(producer, "on", ON_CONFIG, [bad])
    response = client.get(f"/v1/batches/{batch}/report", headers={"Authorization": "Bearer tok-a"})
    assert response.status_code == 422
    assert "'a9'" in response.json()["detail"] and "citation_status" in response.json()["detail"]


def test_report_endpoint_needs_tag_keys_to_recount_redirects(api):
    client, producer = api(tag_keys=[])
    batch = store_arm(producer, "on", ON_CONFIG, synthetic_arm(signer=SIGNER))
    response = client.get(f"/v1/batches/{batch}/report", headers={"Authorization": "Bearer tok-a"})
    assert response.status_code == 503 and "GROUNDED_TAG_KEYS" in response.json()["detail"]
