"""Hybrid corpora end to end: `grounded ingest --embedder` and real workers, embedding through the
real OpenAI client against the fake server's `/v1/embeddings` (tests/worker/fake_openai.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError
from typer.testing import CliRunner, Result

from tests.concepts import DIMENSIONS
from tests.conftest import REPO, RedisSpace, worker_env
from tests.worker.conftest import (
    FAKE_KEY,
    FAKE_KEY_ENV,
    MISSING_KEY_ENV,
    Cluster,
    mcp_stdio,
    question_config,
    settings_for,
)
from tests.worker.fake_openai import FakeOpenAI
from worker.cli import cli
from worker.producer import Producer
from worker.settings import get_settings
from worker.store.embedded import free_port
from worker.tasks.worker_process import WorkerProcess

runner = CliRunner()
FIXTURES = REPO / "tests" / "fixtures" / "corpus"
PARAPHRASE = "damp moisture coils"  # means the "dew heaters" passage, shares none of its words
EMBEDDER = "openai-compatible:concepts"


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


def grounded_cli(monkeypatch: pytest.MonkeyPatch, data_dir: Path, endpoints: str, *args: str,
                 **env: str) -> Result:
    """A `grounded` command run in-process with this machine's embedding endpoints set to `endpoints`."""
    monkeypatch.setenv("GROUNDED_DATA_DIR", str(data_dir))
    monkeypatch.setenv("GROUNDED_EMBEDDING_ENDPOINTS", endpoints)
    monkeypatch.setenv("GROUNDED_ENDPOINT_KEY_BINDINGS", "GROUNDED_TEST_FAKE_LLM_KEY=http://127.0.0.1:*,"
                                                         "GROUNDED_TEST_UNSET_KEY=http://127.0.0.1:*")
    monkeypatch.delenv(MISSING_KEY_ENV, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    try:
        return runner.invoke(cli, list(args))
    finally:
        get_settings.cache_clear()


def ingest_cli(monkeypatch: pytest.MonkeyPatch, data_dir: Path, endpoints: str, *args: str,
               **env: str) -> tuple[int, str]:
    result = grounded_cli(monkeypatch, data_dir, endpoints, "ingest", str(FIXTURES), *args, **env)
    return result.exit_code, " ".join(result.output.split())  # rich wraps long lines


def table_count(path: Path, table: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        conn.close()


@pytest.fixture
def hybrid_dir(tmp_path: Path, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data dir with `notes` (hybrid, embedder openai-compatible:concepts) and `plain` (BM25)."""
    data_dir = tmp_path / "data"
    code, output = ingest_cli(monkeypatch, data_dir, f"concepts={fake_openai.base_url}",
                              "--corpus", "notes", "--embedder", EMBEDDER)
    assert code == 0, output
    assert f"search: hybrid, embedder {EMBEDDER} ({DIMENSIONS} dimensions)" in output
    assert "chunks/s" in output
    code, output = ingest_cli(monkeypatch, data_dir, "", "--corpus", "plain")
    assert code == 0 and "search: BM25 only" in output, output
    return data_dir


@pytest.fixture
def hybrid_cluster(
    redis_space: RedisSpace, hybrid_dir: Path, fake_openai: FakeOpenAI, worker_process: Callable[..., WorkerProcess]
) -> Iterator[Cluster]:
    env = worker_env(redis_space, hybrid_dir, **{FAKE_KEY_ENV: FAKE_KEY, MISSING_KEY_ENV: None},
                     GROUNDED_EMBEDDING_ENDPOINTS=f"concepts={fake_openai.base_url}")
    worker = worker_process(env)
    producer = Producer(settings_for(redis_space, hybrid_dir))
    try:
        yield Cluster(redis_space, worker, producer)
    finally:
        producer.app.close()


def config(corpus: str, fake_openai: FakeOpenAI, **run: int) -> dict:
    return question_config({"PassageSearchCapability": {"corpus": corpus}}, model="fake-model",
                           endpoint={"base_url": fake_openai.base_url, "api_key_env": FAKE_KEY_ENV},
                           run={"retries": 1, **run})


def test_S1_a_job_over_a_hybrid_corpus_cites_what_bm25_would_not_rank(
    hybrid_cluster: Cluster, fake_openai: FakeOpenAI
) -> None:
    """The fake model searches with the question and cites the first chunk it is shown."""
    answers = {}
    for corpus in ("notes", "plain"):
        batch_id = hybrid_cluster.submit([{"custom_id": corpus, "question": PARAPHRASE}], config(corpus, fake_openai))
        hybrid_cluster.wait(batch_id)
        [result] = hybrid_cluster.store.iter_results(batch_id)
        assert result.status == "succeeded", result.error
        answers[corpus] = result.turns[0]
    assert answers["plain"].cited == []  # BM25 alone found nothing to show
    hybrid = answers["notes"]
    assert hybrid.citation_status == "grounded"
    assert "dew heaters" in hybrid.cited[0].content
    queries = [r["body"]["input"] for r in fake_openai.embedding_requests]
    assert [PARAPHRASE] in queries  # the worker embedded the query through the real client


def test_S4_an_embedding_endpoint_that_is_down_fails_the_job_after_its_retries(
    redis_space: RedisSpace, hybrid_dir: Path, fake_openai: FakeOpenAI, worker_process: Callable[..., WorkerProcess]
) -> None:
    env = worker_env(redis_space, hybrid_dir, **{FAKE_KEY_ENV: FAKE_KEY}, GROUNDED_EMBEDDING_ENDPOINTS=f"concepts={dead_url()}")
    worker = worker_process(env)
    producer = Producer(settings_for(redis_space, hybrid_dir))
    try:
        cluster = Cluster(redis_space, worker, producer)
        batch_id = cluster.submit([{"custom_id": "down", "question": PARAPHRASE}], config("notes", fake_openai))
        cluster.wait(batch_id, timeout=90)
        [result] = cluster.store.iter_results(batch_id)
    finally:
        producer.app.close()
    assert result.status == "failed" and result.attempts == 2  # retried once, like a model request (H6)
    assert result.error is not None and result.error.type == "ModelConnectionError"


def test_S3_a_corpus_embedder_the_worker_cannot_serve_is_the_jobs_error(
    redis_space: RedisSpace, hybrid_dir: Path, fake_openai: FakeOpenAI, worker_process: Callable[..., WorkerProcess]
) -> None:
    """No GROUNDED_EMBEDDING_ENDPOINTS entry for the corpus's model: a permanent error, naming it."""
    env = worker_env(redis_space, hybrid_dir, **{FAKE_KEY_ENV: FAKE_KEY})
    worker = worker_process(env)
    producer = Producer(settings_for(redis_space, hybrid_dir))
    try:
        cluster = Cluster(redis_space, worker, producer)
        batch_id = cluster.submit([{"custom_id": "x", "question": PARAPHRASE}], config("notes", fake_openai))
        cluster.wait(batch_id)
        [result] = cluster.store.iter_results(batch_id)
    finally:
        producer.app.close()
    assert result.status == "failed" and result.attempts == 1
    assert result.error is not None and "no endpoint serves 'concepts'" in result.error.message


def test_S5_an_unknown_embedder_is_one_error_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, output = ingest_cli(monkeypatch, tmp_path, "", "--corpus", "c", "--embedder", "nosuch:model")
    assert code == 1 and "ingest stopped: embedder 'nosuch:model' cannot be used here" in output
    assert not (tmp_path / "corpora" / "c.sqlite").exists()


def test_S5_a_missing_key_is_one_error_and_writes_nothing(
    tmp_path: Path, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoints = f'{{"concepts": {{"base_url": "{fake_openai.base_url}", "api_key_env": "{MISSING_KEY_ENV}"}}}}'
    code, output = ingest_cli(monkeypatch, tmp_path, endpoints, "--corpus", "c", "--embedder", EMBEDDER)
    assert code == 1 and f"{MISSING_KEY_ENV!r} is not set" in output
    assert not (tmp_path / "corpora" / "c.sqlite").exists()


def test_S5_a_key_sent_only_where_it_is_bound(
    tmp_path: Path, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    base_url = fake_openai.base_url.replace("127.0.0.1", "localhost")
    endpoints = f'{{"concepts": {{"base_url": "{base_url}", "api_key_env": "{FAKE_KEY_ENV}"}}}}'
    code, output = ingest_cli(monkeypatch, tmp_path, endpoints, "--corpus", "c", "--embedder", EMBEDDER,
                              **{FAKE_KEY_ENV: FAKE_KEY})
    assert code == 1 and "may be sent only to base URLs matching 'http://127.0.0.1:*'" in output
    with_key = f'{{"concepts": {{"base_url": "{fake_openai.base_url}", "api_key_env": "{FAKE_KEY_ENV}"}}}}'
    code, output = ingest_cli(monkeypatch, tmp_path, with_key, "--corpus", "c", "--embedder", EMBEDDER,
                              **{FAKE_KEY_ENV: FAKE_KEY})
    assert code == 0, output
    assert fake_openai.embedding_requests[-1]["authorization"] == f"Bearer {FAKE_KEY}"


def test_S5_an_embedding_endpoint_that_is_down_stops_ingest_with_nothing_written(
    hybrid_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    new = tmp_path / "new.md"
    new.write_text("# New\n\nA page about damp coils.\n")
    corpus = hybrid_dir / "corpora" / "notes.sqlite"
    before = table_count(corpus, "chunks"), table_count(corpus, "chunk_vectors")
    monkeypatch.setenv("GROUNDED_DATA_DIR", str(hybrid_dir))
    monkeypatch.setenv("GROUNDED_EMBEDDING_ENDPOINTS", f"concepts={dead_url()}")
    get_settings.cache_clear()
    try:
        result = runner.invoke(cli, ["ingest", str(new), "--corpus", "notes"])  # the corpus's own embedder
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 1 and "the embedder failed (ModelConnectionError" in " ".join(result.output.split())
    assert (table_count(corpus, "chunks"), table_count(corpus, "chunk_vectors")) == before


def test_S5_a_dimension_change_behind_the_same_name_is_refused(
    hybrid_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = FakeOpenAI()
    other.embedding_dimensions = 8
    other.start()
    try:
        code, output = ingest_cli(monkeypatch, hybrid_dir, f"concepts={other.base_url}", "--corpus", "notes")
    finally:
        other.stop()
    assert code == 1 and f"returned 8-dimensional vectors, but this corpus stores {DIMENSIONS}" in output


def test_S2_embedder_none_makes_a_corpus_bm25_only(hybrid_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, output = ingest_cli(monkeypatch, hybrid_dir, "", "--corpus", "notes", "--embedder", "none")
    assert code == 0 and "search: BM25 only" in output, output
    conn = sqlite3.connect(hybrid_dir / "corpora" / "notes.sqlite")
    assert conn.execute("SELECT value FROM corpus_meta WHERE key = 'embedder'").fetchone() is None
    conn.close()


def test_S6_corpus_search_searches_a_hybrid_corpus_with_the_embedder_served_here(
    hybrid_dir: Path, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    done = grounded_cli(monkeypatch, hybrid_dir, f"concepts={fake_openai.base_url}",
                        "corpus", "search", "notes", PARAPHRASE, "-k", "1")
    assert done.exit_code == 0, done.output
    assert "notes" in done.stdout and "dew heaters" in done.stdout  # found by its vector: BM25 shares no word
    assert [PARAPHRASE] in [r["body"]["input"] for r in fake_openai.embedding_requests]


def test_S6_corpus_search_without_the_corpus_embedder_says_so_in_one_line(
    hybrid_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unserved = grounded_cli(monkeypatch, hybrid_dir, "", "corpus", "search", "notes", PARAPHRASE)
    assert unserved.exit_code == 1 and unserved.stdout == ""
    assert " ".join(unserved.stderr.split()) == (
        f"corpus 'notes' cannot be searched here: embedder '{EMBEDDER}': no endpoint serves 'concepts' here "
        "(GROUNDED_EMBEDDING_ENDPOINTS names: none)")
    down = grounded_cli(monkeypatch, hybrid_dir, f"concepts={dead_url()}", "corpus", "search", "notes", PARAPHRASE)
    assert down.exit_code == 1 and "Traceback" not in down.output
    assert " ".join(down.stderr.split()).startswith(
        "corpus 'notes' cannot be searched here: its embedder failed (ModelConnectionError")
    assert grounded_cli(monkeypatch, hybrid_dir, "", "corpus", "search", "plain", "dew heaters").exit_code == 0


async def test_S6_mcp_search_searches_a_hybrid_corpus_or_fails_with_one_mcp_error(
    redis_space: RedisSpace, hybrid_dir: Path, fake_openai: FakeOpenAI
) -> None:
    async with mcp_stdio(redis_space, hybrid_dir, "acme",
                         GROUNDED_EMBEDDING_ENDPOINTS=f"concepts={fake_openai.base_url}") as session:
        found = await session.call_tool("search", {"query": PARAPHRASE, "corpus": "notes", "limit": 1})
        assert not found.is_error and found.structured_content is not None, found.content
        [hit] = found.structured_content["hits"]
        assert "dew heaters" in hit["text"] and hit["document"] == "notes"
    async with mcp_stdio(redis_space, hybrid_dir, "acme") as session:
        with pytest.raises(MCPError) as refused:
            await session.call_tool("search", {"query": PARAPHRASE, "corpus": "notes"})
        assert refused.value.message.startswith(
            f"corpus 'notes' cannot be searched here: embedder '{EMBEDDER}': no endpoint serves 'concepts' here")
        assert refused.value.data["status"] == 503
        plain = await session.call_tool("search", {"query": "dew heaters", "corpus": "plain"})
        assert not plain.is_error, plain.content
