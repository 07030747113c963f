"""The MCP server through the official `mcp` client (ClientSession): over stdio, as `grounded mcp`
started by a desktop agent, and over streamable HTTP at the API's `/mcp`, behind its tokens. Real
Redis, the session's real worker process, the offline extractive model."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.conftest import ingested_data_dir
from tests.worker.conftest import PASSAGES, POLICY, Cluster, mcp_stdio, question_config, serve, settings_for
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


def stdio_session(cluster: Cluster, data_dir: Path, served: dict[str, Path], tenant: str,
                  **env: str) -> AbstractAsyncContextManager[ClientSession]:
    configs = ",".join(f"{name}={path}" for name, path in served.items())
    return mcp_stdio(cluster.space, data_dir, tenant, GROUNDED_CONFIGS=configs,
                     GROUNDED_DEFAULT_CONFIG="handbook-qa", **env)


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
        # no GROUNDED_TENANT_CORPORA here, so every tenant may name every corpus; scoped: test_H13_*
        assert unserved.message == "corpus 'elsewhere' is not served here; known: handbook"


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


SCOPES = "acme=handbook,globex=atlas"


@pytest.fixture(scope="module")
def scoped_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir serving `handbook` and `atlas` (the same documents under two names)."""
    root = ingested_data_dir(tmp_path_factory.mktemp("scoped"), "handbook")
    (root / "corpora" / "atlas.sqlite").write_bytes((root / "corpora" / "handbook.sqlite").read_bytes())
    return root


async def scoped_searches(session_of: Any) -> None:
    """What each tenant may search and learn under SCOPES, through whichever transport `session_of`
    opens: a tenant's own corpus is searched, another's reads as unknown and is never listed."""
    async with session_of("acme") as acme:
        found = await call(acme, "search", query="reflector mirror")   # acme's only corpus is the default
        assert found["hits"] and "400 mm" in found["hits"][0]["text"]
        hidden = await refusal(acme, "search", query="reflector mirror", corpus="atlas")
        assert hidden.message == "corpus 'atlas' is not served here; known: handbook"
        assert hidden.data["status"] == 422
    async with session_of("globex") as globex:
        assert (await call(globex, "search", query="reflector mirror", corpus="atlas"))["hits"]
        hidden = await refusal(globex, "search", query="reflector mirror", corpus="handbook")
        assert hidden.message == "corpus 'handbook' is not served here; known: atlas"
    async with session_of("initech") as unscoped:
        nothing = await refusal(unscoped, "search", query="reflector mirror")
        assert nothing.message == "name the corpus to search; served here: none"


async def test_H13_stdio_search_serves_and_names_only_the_tenants_corpora(cluster: Cluster, scoped_dir: Path,
                                                                         served: dict[str, Path]) -> None:
    await scoped_searches(lambda tenant: stdio_session(cluster, scoped_dir, served, tenant,
                                                       GROUNDED_TENANT_CORPORA=SCOPES))


async def test_H13_http_search_serves_and_names_only_the_tokens_tenants_corpora(cluster: Cluster, scoped_dir: Path,
                                                                               served: dict[str, Path]) -> None:
    settings = settings_for(cluster.space, scoped_dir, api_tokens={**TOKENS, "tok-initech": "initech"},
                            tenant_corpora=SCOPES, configs=served, default_config="handbook-qa")
    producer = Producer(settings, store=cluster.store, app=cluster.producer.app)
    with serve(create_api(settings, producer=producer)) as url:
        await scoped_searches(lambda tenant: http_session(url, f"tok-{tenant}"))
