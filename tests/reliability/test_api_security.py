"""The producer API under hostile input: fuzzed requests, missing tokens, another tenant's ids,
oversized bodies and batches, and broken JSONL lines.

One deployment serves the module: real Redis, a real worker (extractive model, so answers are
instant), the API over HTTP on uvicorn. Tenant `acme` owns a finished batch with a question and a
conversation, so every route has a real id to be refused for `globex`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error

from tests.conftest import RedisServer, new_space, worker_env
from tests.reliability.conftest import launch_worker
from tests.worker.conftest import PASSAGES, POLICY, question_config, serve, settings_for
from worker.api.app import create_api
from worker.client import GroundedClient
from worker.settings import Settings

TOKENS = {"tok-acme": "acme", "tok-globex": "globex"}
ACME = {"Authorization": "Bearer tok-acme"}
GLOBEX = {"Authorization": "Bearer tok-globex"}
PUBLIC = {("GET", "/healthz"), ("GET", "/metrics")}  # health, and aggregate metrics (no tenant's data)
MAX_REQUEST_BYTES = 64 * 1024
MAX_LINES = 20
FUZZ_EXAMPLES = 100  # per operation: about 1,000 requests, half a minute
QUESTION = "When does the observatory open?"


def operations() -> list[tuple[str, str]]:
    """Every route the OpenAPI schema lists (building the app connects to nothing)."""
    schema = create_api(Settings(api_tokens={"t": "x"}, tag_keys=["k"])).openapi()  # type: ignore[arg-type]
    return sorted((method.upper(), path) for path, item in schema["paths"].items() for method in item)


OPERATIONS = operations()
PRIVATE = [op for op in OPERATIONS if op not in PUBLIC]
WITH_IDS = [op for op in PRIVATE if "{" in op[1]]


@dataclass
class Deployment:
    url: str
    batch_id: str
    job_id: str
    conversation_id: str
    file_id: str

    def path(self, template: str) -> str:
        return template.format(batch_id=self.batch_id, job_id=self.job_id, conversation_id=self.conversation_id,
                               file_id=self.file_id)


def openai_line(custom_id: str, *questions: str) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"messages": [{"role": "user", "content": q} for q in questions]}})


@pytest.fixture(scope="module")
def deployment(redis_server: RedisServer, rel_data_dir: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Deployment]:
    """acme's batch goes in through the OpenAI Batch routes, so it is a batch under both prefixes, and
    its input file is an id for the file routes."""
    space = new_space(redis_server)
    worker = launch_worker(worker_env(space, rel_data_dir), tmp_path_factory.mktemp("api-logs"), concurrency=2)
    config = tmp_path_factory.mktemp("configs") / "qa.yaml"
    config.write_text(json.dumps(question_config(PASSAGES, POLICY)))
    api_settings = settings_for(space, rel_data_dir, api_tokens=TOKENS, max_request_bytes=MAX_REQUEST_BYTES,
                                max_batch_lines=MAX_LINES, configs={"qa": config})
    try:
        with serve(create_api(api_settings)) as url, GroundedClient(url, "tok-acme") as acme:
            text = openai_line("q", QUESTION) + "\n" + openai_line("c", QUESTION, "How large is the reflector mirror?")
            uploaded = acme.http.post("/openai/v1/files", files={"file": ("in.jsonl", text.encode())},
                                      data={"purpose": "batch"}).json()
            batch = acme.http.post("/openai/v1/batches", json={
                "input_file_id": uploaded["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}).json()
            assert acme.wait(batch["id"], timeout=60)["counts"]["succeeded"] == 2
            results = {r["custom_id"]: r for r in acme.results(batch["id"])}
            yield Deployment(url, batch["id"], results["q"]["job_id"], results["c"]["conversation_id"], uploaded["id"])
    finally:
        worker.stop()
        space.clean()


def request(deployment: Deployment, method: str, template: str, headers: dict[str, str]) -> httpx2.Response:
    body = {"question": QUESTION} if template.endswith("/turns") else {}
    content = json.dumps(body).encode() if method == "POST" else None
    return httpx2.request(method, deployment.url + deployment.path(template), headers=headers, content=content)


# --- tokens and tenants -----------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "template"), PRIVATE, ids=[f"{m} {p}" for m, p in PRIVATE])
def test_every_endpoint_but_health_refuses_a_missing_or_wrong_token(deployment, method: str, template: str) -> None:
    for headers in ({}, {"Authorization": "Bearer tok-wrong"}, {"Authorization": "tok-acme"}):
        response = request(deployment, method, template, headers)
        assert response.status_code == 401, (headers, response.text)


def test_only_health_and_metrics_are_public(deployment) -> None:
    assert set(OPERATIONS) - set(PRIVATE) == PUBLIC
    for method, template in PUBLIC:
        assert request(deployment, method, template, {}).status_code == 200


@pytest.mark.parametrize(("method", "template"), WITH_IDS, ids=[f"{m} {p}" for m, p in WITH_IDS])
def test_another_tenants_ids_are_404_on_every_route(deployment, method: str, template: str) -> None:
    response = request(deployment, method, template, GLOBEX)
    assert response.status_code == 404, response.text
    assert deployment.batch_id not in json.dumps([b["id"] for b in httpx2.get(
        f"{deployment.url}/v1/batches", headers=GLOBEX).json()])


def test_a_tenant_refused_elsewhere_changed_nothing(deployment) -> None:
    for method, template in WITH_IDS:
        request(deployment, method, template, GLOBEX)
    mine = httpx2.get(f"{deployment.url}/v1/batches/{deployment.batch_id}", headers=ACME).json()
    assert mine["state"] == "completed" and mine["counts"]["succeeded"] == 2 and mine["counts"]["cancelled"] == 0


# --- limits and line numbers ------------------------------------------------------------------------


def batches_of(deployment: Deployment, headers: dict[str, str]) -> list[str]:
    return [b["id"] for b in httpx2.get(f"{deployment.url}/v1/batches", headers=headers).json()]


def test_a_body_over_the_byte_limit_is_413_and_stores_nothing(deployment) -> None:
    before = batches_of(deployment, ACME)
    lines = [{"custom_id": f"big-{i}", "question": "x" * 1000} for i in range(100)]
    body = json.dumps({"config": question_config(PASSAGES), "lines": lines}).encode()
    assert len(body) > MAX_REQUEST_BYTES
    declared = httpx2.post(f"{deployment.url}/v1/batches", headers={**ACME, "Content-Type": "application/json"},
                           content=body)
    chunked = httpx2.post(f"{deployment.url}/v1/batches", headers={**ACME, "Content-Type": "application/json"},
                          content=iter([body[i : i + 8192] for i in range(0, len(body), 8192)]))
    for response in (declared, chunked):
        assert response.status_code == 413
        [error] = response.json()["detail"]
        assert f"larger than {MAX_REQUEST_BYTES} bytes" in error["problem"] and "GROUNDED_MAX_REQUEST_BYTES" in error["problem"]
    assert batches_of(deployment, ACME) == before


def test_a_batch_over_the_line_limit_is_422_naming_the_first_line_too_many(deployment) -> None:
    lines = [{"custom_id": f"n-{i}", "question": QUESTION} for i in range(MAX_LINES + 1)]
    response = httpx2.post(f"{deployment.url}/v1/batches", headers=ACME,
                           json={"config": question_config(PASSAGES), "lines": lines})
    assert response.status_code == 422
    assert response.json()["detail"] == [{"line": MAX_LINES + 1, "problem": f"a batch holds at most {MAX_LINES} jobs"}]


def test_jsonl_upload_errors_carry_the_file_line_numbers(deployment) -> None:
    good = json.dumps({"custom_id": "a", "question": QUESTION})
    text = "\n".join([
        good,                                                       # 1
        "",                                                         # 2 blank lines are skipped, still counted
        '{"custom_id": "b", "question": ',                          # 3 broken JSON
        json.dumps({"question": QUESTION}),                         # 4 no custom_id
        good,                                                       # 5 repeats line 1's custom_id
        json.dumps({"custom_id": "f", "question": QUESTION, "history": []}),  # 6 a question carries no history
        json.dumps(["not", "an", "object"]),                        # 7
        json.dumps({"custom_id": "h", "question": QUESTION}),       # 8 fine
    ])
    files = {"file": ("batch.jsonl", text.encode(), "application/x-ndjson")}
    response = httpx2.post(f"{deployment.url}/v1/batches", headers=ACME, files=files,
                           data={"config": json.dumps(question_config(PASSAGES))})
    assert response.status_code == 422
    errors = response.json()["detail"]
    assert [e["line"] for e in errors] == [3, 4, 5, 6, 7]
    assert errors[0]["problem"].startswith("not valid JSON")
    assert "custom_id is required" in errors[1]["problem"]
    assert "repeats line 1" in errors[2]["problem"]
    assert "no history" in errors[3]["problem"] and "JSON object" in errors[4]["problem"]


# --- fuzzing: no request makes the API fail ---------------------------------------------------------

def fuzz(operation: Any, deployment: Deployment, seen: list[int]) -> None:
    """Hypothesis drives schemathesis' strategy for one operation (its pytest plugin predates pytest 9)."""

    @given(case=operation.as_strategy())
    # CI replays one fixed set of cases so a submission is judged on its own change; runs elsewhere
    # explore new inputs, and what they find becomes a test of its own (as the events ?after= did)
    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck), database=None, derandomize=bool(os.environ.get("CI")))
    def run(case: Any) -> None:
        for name in ("batch_id", "job_id", "conversation_id", "file_id"):  # half the cases aim at acme's real ids
            value = (case.path_parameters or {}).get(name)
            if isinstance(value, str) and len(value) % 2 == 0:
                case.path_parameters[name] = getattr(deployment, name)
        response = case.call_and_validate(base_url=deployment.url, headers=ACME, checks=[not_a_server_error])
        seen.append(response.status_code)

    run()


@pytest.mark.slow
def test_fuzzed_requests_never_get_a_server_error(deployment: Deployment) -> None:
    schema = schemathesis.openapi.from_url(f"{deployment.url}/openapi.json")
    statuses: dict[str, list[int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        fuzz(operation, deployment, statuses.setdefault(operation.label, []))
    assert {label.split(" ", 1)[1] for label in statuses} == {path for _, path in OPERATIONS}
    assert all(code < 500 for codes in statuses.values() for code in codes)
    cases = sum(len(codes) for codes in statuses.values())
    assert cases >= len(OPERATIONS) * 5
    print(f"fuzzed {cases} cases over {len(statuses)} operations")
