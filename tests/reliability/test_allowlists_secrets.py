"""Allowlists at submission, and secrets that never reach results, events, logs or transcripts.

A job config comes from whoever holds a token, so what it may name is checked before anything is
stored: capability types, models (against the optional GROUNDED_MODEL_ALLOWLIST), corpus names
(never paths), and the environment variable an endpoint key is read from (never the worker's own
secrets). Then a real worker runs jobs whose failures quote the key back, and every byte the
system stored, logged, served or sent to the model is searched for each secret.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis

from tests.conftest import RedisSpace
from tests.reliability.conftest import PASSAGES, endpoint_config
from tests.worker.conftest import FAKE_KEY_ENV, question_config, serve, settings_for
from worker.api.app import create_api
from worker.client import GroundedClient
from worker.jobs.composition import ALLOWED
from worker.jobs.lines import CONFIG_LINE
from worker.producer import Producer
from worker.settings import Settings

LINE = [{"custom_id": "a", "question": "When does the observatory open?"}]


def producer(data_dir: Path, **settings: Any) -> Producer:
    """Validation touches neither Redis nor Celery, so a producer for an unused URL will do."""
    return Producer(Settings(redis_url="redis://127.0.0.1:1/0", data_dir=data_dir, tag_keys=["k"], **settings))


def config_errors(data_dir: Path, config: dict[str, Any], **settings: Any) -> list[str]:
    report = producer(data_dir, **settings).validate(LINE, config)
    assert not report.ok
    assert {e.line_no for e in report.errors} == {CONFIG_LINE}
    return [e.problem for e in report.errors]


UNKNOWN_CAPABILITIES = ["LocalWorkspace", "MCPServer", "WebFetch", "Thinking",
                        "capabilities.policy.CitationPolicyCapability", {"Toolset": {"name": "shell"}},
                        {"mcp": {"url": "http://evil.example/sse"}}]


@pytest.mark.parametrize("capability", UNKNOWN_CAPABILITIES, ids=[json.dumps(c) for c in UNKNOWN_CAPABILITIES])
def test_unknown_capability_types_are_rejected_at_submission(rel_data_dir: Path, capability: Any) -> None:
    [problem] = config_errors(rel_data_dir, question_config(PASSAGES, capability))
    assert "is not allowed here" in problem and all(name in problem for name in ALLOWED)


MODEL_ALLOWLIST = ["extractive", "openai-compatible:qwen*"]


@pytest.mark.parametrize("config", [
    question_config(PASSAGES, model="openai:gpt-4.1"),
    question_config(PASSAGES, model="llama-70b", endpoint={"base_url": "http://vllm:8000/v1"}),
    question_config(PASSAGES, model="test"),
], ids=["provider-string", "endpoint-model", "pydantic-ai-test-model"])
def test_models_outside_the_allowlist_are_rejected_at_submission(rel_data_dir: Path, config: dict) -> None:
    [problem] = config_errors(rel_data_dir, config, model_allowlist=MODEL_ALLOWLIST)
    assert "is not allowed" in problem and "extractive" in problem


def test_models_inside_the_allowlist_pass_and_no_allowlist_allows_any(rel_data_dir: Path) -> None:
    allowed = question_config(PASSAGES, model="qwen3-8b", endpoint={"base_url": "http://vllm:8000/v1"})
    assert producer(rel_data_dir, model_allowlist=MODEL_ALLOWLIST).validate(LINE, allowed).ok
    assert producer(rel_data_dir).validate(LINE, question_config(PASSAGES, model="openai:gpt-4.1")).ok


CORPUS_PATHS = ["../../etc/passwd", "/etc/passwd", "handbook/../handbook", "handbook.sqlite", "..", "~root",
                "C:\\corpora\\handbook", "hand book", "%2e%2e%2fetc", "", "handbook\x00", "-rf"]


@pytest.mark.parametrize("corpus", CORPUS_PATHS, ids=[repr(c) for c in CORPUS_PATHS])
@pytest.mark.parametrize("form", ["options", "positional"])
def test_corpus_names_with_paths_are_rejected_at_submission(rel_data_dir: Path, corpus: str, form: str) -> None:
    entry = {"PassageSearchCapability": {"corpus": corpus} if form == "options" else corpus}
    [problem] = config_errors(rel_data_dir, question_config(entry))
    assert "is not a corpus name" in problem and "paths" in problem


@pytest.mark.parametrize("name", ["GROUNDED_TAG_KEYS", "GROUNDED_API_TOKENS", "GROUNDED_REDIS_URL"])
def test_an_endpoint_may_not_send_the_workers_own_secrets_as_its_key(rel_data_dir: Path, name: str) -> None:
    """The job chooses the base_url, so naming a worker setting would send it to any server."""
    config = question_config(PASSAGES, model="m", endpoint={"base_url": "http://attacker.example/v1",
                                                            "api_key_env": name})
    [problem] = config_errors(rel_data_dir, config)
    assert name in problem and "worker's own" in problem


# --- secrets never appear in results, events, logs or transcripts -----------------------------------


def everything_stored(space: RedisSpace) -> bytes:
    """Every value under the test's prefix, decompressed: results, jobs, conversations, events."""
    store = space.store()
    client: redis.Redis = store.redis
    out = []
    for key in client.scan_iter(match=f"{space.prefix}*", count=500):
        kind = client.type(key).decode()
        values: list[bytes] = []
        if kind == "string":
            values = [client.get(key) or b""]
        elif kind == "hash":
            values = list(client.hgetall(key).values())
        elif kind == "list":
            values = client.lrange(key, 0, -1)
        elif kind == "set":
            values = list(client.smembers(key))
        elif kind == "zset":
            values = client.zrange(key, 0, -1)
        elif kind == "stream":
            values = [v for _, fields in client.xrange(key) for v in fields.values()]
        out += [key] + [store._unpack(v) for v in values]
    return b"\n".join(out)


@pytest.mark.slow
def test_secrets_never_reach_results_events_logs_or_transcripts(redis_space, fleet_for, faulty_openai,
                                                                 rel_data_dir: Path) -> None:
    tag_key, token, model_key = (f"secret-{name}-{secrets.token_hex(12)}" for name in ("tag", "token", "model"))
    fleet = fleet_for(redis_space, GROUNDED_TAG_KEYS=tag_key, GROUNDED_API_TOKENS=f"{token}=acme",
                      **{FAKE_KEY_ENV: model_key})
    worker = fleet.start()
    api_settings = settings_for(redis_space, rel_data_dir, api_tokens={token: "acme"})
    api_settings = api_settings.model_copy(update={"tag_keys": Settings(tag_keys=tag_key).tag_keys})  # type: ignore[arg-type]
    lines = [
        {"custom_id": "redirected", "question": "[uncited] When does the observatory open?"},
        {"custom_id": "retried", "question": f"[fault:429:secret{secrets.token_hex(4)}:1] When does it open?"},
        {"custom_id": "key-quoted", "question": f"[fault:echo401:secret{secrets.token_hex(4)}:all] When?"},
        {"custom_id": "conversation", "turns": ["When does the observatory open?", "How large is the mirror?"]},
    ]
    seen_by_model = len(faulty_openai.requests)
    with serve(create_api(api_settings)) as url, GroundedClient(url, token) as client:
        batch = client.submit(lines, endpoint_config(faulty_openai, PASSAGES, "CitationPolicyCapability",
                                                     run={"retries": 2}))
        final = client.wait(batch["id"], timeout=60)
        results = list(client.results(batch["id"]))
        served = [json.dumps(results), json.dumps(client.events(batch["id"])), json.dumps(client.batches()),
                  json.dumps(client.status(batch["id"]))]
        served += [json.dumps(client.job(r["job_id"])) for r in results]
        conversation = next(r["conversation_id"] for r in results if r["custom_id"] == "conversation")
        headers = {"Authorization": f"Bearer {token}"}
        served.append(httpx2.get(f"{url}/v1/conversations/{conversation}?wire=true", headers=headers).text)
        served.append(httpx2.get(f"{url}/v1/batches/{batch['id']}/report", headers=headers).text)
        served.append(httpx2.get(f"{url}/metrics").text)
    by_id = {r["custom_id"]: r for r in results}
    assert final["counts"] == {**final["counts"], "succeeded": 3, "failed": 1}
    assert by_id["key-quoted"]["error"]["type"] == "ModelAuthenticationError" and "401" in by_id["key-quoted"]["error"]["message"]
    assert by_id["retried"]["attempts"] == 2 and by_id["redirected"]["turns"][0]["redirects"] == 1
    sent_to_model = [r for r in faulty_openai.requests[seen_by_model:]]
    assert {r["authorization"] for r in sent_to_model} == {f"Bearer {model_key}"}, "the key does reach its server"
    worker.stop()

    haystacks = {
        "stored in Redis": everything_stored(redis_space),
        "served by the API": "\n".join(served).encode(),
        "logged by the worker": worker.output().encode(),
        "sent to the model (transcripts)": json.dumps([r["body"] for r in sent_to_model]).encode(),
    }
    for secret in (tag_key, token, model_key):
        for where, haystack in haystacks.items():
            assert secret.encode() not in haystack, f"a secret was {where}"
    assert b"[redacted]" in haystacks["stored in Redis"], "the quoted key was replaced, not dropped silently"
