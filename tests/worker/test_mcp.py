"""The MCP server through the official `mcp` client (ClientSession): over stdio, as `grounded mcp`
started by a desktop agent, and over streamable HTTP at the API's `/mcp`, behind its tokens. Real
Redis, the session's real worker process, the offline extractive model."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.conftest import REPO, TEST_TAG_KEY
from tests.worker.conftest import PASSAGES, POLICY, Cluster, question_config, serve, settings_for
from worker.api.app import create_api
from worker.client import BatchRejected, GroundedClient, NotFound
from worker.producer import Producer

TOKENS = {"tok-acme": "acme", "tok-globex": "globex"}
TOOLS = {"ask", "search", "submit_batch", "batch_status", "batch_results"}
CONFIG = question_config(PASSAGES, POLICY)


MAX_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("configs")
    paths = {"handbook-qa": root / "handbook.yaml", "not-allowed": root / "gpt.yaml"}
    paths["handbook-qa"].write_text(yaml.safe_dump(CONFIG))
    paths["not-allowed"].write_text(yaml.safe_dump(question_config(PASSAGES, model="openai:gpt-4.1")))
    return paths


@asynccontextmanager
async def stdio_session(cluster: Cluster, data_dir: Path, served: dict[str, Path], tenant: str
                        ) -> AsyncIterator[ClientSession]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GROUNDED_")}
    env.update(GROUNDED_REDIS_URL=cluster.space.url, GROUNDED_KEY_PREFIX=cluster.space.prefix,
               GROUNDED_DATA_DIR=str(data_dir), GROUNDED_TAG_KEYS=TEST_TAG_KEY, GROUNDED_CLI_TENANT=tenant,
               GROUNDED_CONFIGS=",".join(f"{name}={path}" for name, path in served.items()),
               GROUNDED_DEFAULT_CONFIG="handbook-qa")
    params = StdioServerParameters(command=sys.executable, args=["-m", "worker.cli", "mcp"], env=env, cwd=str(REPO))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@pytest.fixture(scope="module")
def api_url(cluster: Cluster, data_dir: Path, served: dict[str, Path]) -> Iterator[str]:
    settings = settings_for(cluster.space, data_dir, api_tokens=TOKENS, configs=served, default_config="handbook-qa",
                            model_allowlist=["extractive"], max_request_bytes=MAX_BYTES)
    with serve(create_api(settings, producer=Producer(settings, store=cluster.store, app=cluster.producer.app))) as url:
        yield url


@asynccontextmanager
async def http_session(api_url: str, token: str) -> AsyncIterator[ClientSession]:
    timeout = httpx2.Timeout(30, read=300)
    async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=timeout) as http,
                streamable_http_client(f"{api_url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write) as session):
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def refusal(session: ClientSession, tool: str, **arguments: Any) -> MCPError:
    with pytest.raises(MCPError) as raised:
        await session.call_tool(tool, arguments)
    return raised.value


async def test_I6_stdio_ask_search_and_a_batch_end_to_end(cluster: Cluster, data_dir: Path,
                                                          served: dict[str, Path]) -> None:
    async with stdio_session(cluster, data_dir, served, "acme") as session:
        assert {tool.name for tool in (await session.list_tools()).tools} == TOOLS

        answer = await call(session, "ask", question="When does the observatory open?")
        assert answer["status"] == "succeeded" and "19:00" in answer["answer"] and answer["config"] == "handbook-qa"
        assert answer["citation_status"] == "grounded" and answer["violations"] == 0
        citation = answer["citations"][0]
        assert citation["document"] == "Oakridge Observatory Handbook" and citation["page"] == 1 and citation["chunk_id"]
        result = cluster.store.load_result(answer["job_id"])
        assert result is not None and result.kind == "question" and result.compactor_registered is False
        assert cluster.store.load_batch(answer["batch_id"]).tenant == "acme"  # type: ignore[union-attr]

        found = await call(session, "search", query="reflector mirror collimate")
        hit = found["hits"][0]
        assert "400 mm" in hit["text"] and hit["document"] == "Oakridge Observatory Handbook"
        assert hit["heading_path"][-1] == "Reflector" and hit["page"] == 1 and hit["score"] > 0

        lines = [{"custom_id": "hours", "question": "When does the observatory open?"},
                 {"custom_id": "mirror", "question": "How large is the reflector mirror?"}]
        accepted = await call(session, "submit_batch", lines=lines)
        assert accepted["counts"]["total"] == 2 and accepted["config"] == "handbook-qa"
        cluster.wait(accepted["id"], timeout=60)
        status = await call(session, "batch_status", batch_id=accepted["id"])
        assert status["state"] == "completed" and status["counts"]["succeeded"] == 2
        first = await call(session, "batch_results", batch_id=accepted["id"], limit=1)
        assert [r["custom_id"] for r in first["results"]] == ["hours"] and first["next_offset"] == 1
        rest = await call(session, "batch_results", batch_id=accepted["id"], offset=first["next_offset"])
        assert [r["custom_id"] for r in rest["results"]] == ["mirror"] and rest["next_offset"] is None
        assert rest["results"][0]["turns"][0]["citation_status"] == "grounded"

        others = cluster.submit([{"custom_id": "theirs", "question": "q"}], CONFIG, tenant="globex")
        hidden = await refusal(session, "batch_status", batch_id=others)
        assert hidden.message == f"batch {others!r} not found" and hidden.data["status"] == 404
        unknown = await refusal(session, "ask", question="q", config="nope")
        assert "config 'nope' is not served here; served configs: handbook-qa" in unknown.message
        unserved = await refusal(session, "search", query="q", corpus="elsewhere")
        assert "corpus 'elsewhere' is not served here; known: handbook" in unserved.message


async def test_I5_I7_http_tools_act_as_the_tokens_tenant_and_fail_as_the_api_does(api_url: str,
                                                                                  cluster: Cluster) -> None:
    async with http_session(api_url, "tok-acme") as acme:
        assert {tool.name for tool in (await acme.list_tools()).tools} == TOOLS
        answer = await call(acme, "ask", question="How large is the reflector mirror?")
        assert answer["status"] == "succeeded" and "400 mm" in answer["answer"]
        assert cluster.store.load_batch(answer["batch_id"]).tenant == "acme"  # type: ignore[union-attr]

        bad_lines = [{"custom_id": "ok", "question": "fine"}, "{broken", {"question": "no id"}]
        rejected = await refusal(acme, "submit_batch", lines=bad_lines)
        with GroundedClient(api_url, "tok-acme") as native, pytest.raises(BatchRejected) as native_rejected:
            native.submit(bad_lines, CONFIG)
        assert rejected.data == {"status": 422, "detail": native_rejected.value.errors}
        assert "line 2: not valid JSON" in rejected.message and "nothing was enqueued" in rejected.message
        disallowed = await refusal(acme, "ask", question="q", config="not-allowed")
        assert disallowed.message == "config: model 'openai:gpt-4.1' is not allowed on this worker; allowed: extractive"

    async with http_session(api_url, "tok-globex") as globex:
        hidden = await refusal(globex, "batch_results", batch_id=answer["batch_id"])
        with GroundedClient(api_url, "tok-globex") as native, pytest.raises(NotFound) as native_hidden:
            native.status(answer["batch_id"])
        assert hidden.message == native_hidden.value.detail and hidden.data["status"] == 404

    no_token = httpx2.post(f"{api_url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    wrong = httpx2.post(f"{api_url}/mcp", json={}, headers={"Authorization": "Bearer tok-wrong"})
    assert no_token.status_code == wrong.status_code == 401 and no_token.headers["www-authenticate"] == "Bearer"
    too_large = httpx2.post(f"{api_url}/mcp", headers={"Authorization": "Bearer tok-acme"}, content=b"x" * (MAX_BYTES + 1))
    assert too_large.status_code == 413
