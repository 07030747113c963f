"""Hybrid search in the SQLite corpus: vectors with the corpus, the recorded embedder, fusion.

Embedders are pydantic-ai's TestEmbeddingModel (plumbing) and tests/concepts.py's model (ranking:
a paraphrase that shares no word with its passage).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import stat
from pathlib import Path

import numpy as np
import pytest
from pydantic_ai.embeddings import TestEmbeddingModel

from capabilities.corpus import SQLiteCorpus, ingest
from capabilities.corpus.embedding import (
    CorpusEmbedder,
    EmbedderMismatch,
    EmbedderRequired,
    EmbeddingError,
    NoVectors,
    corpus_embedder,
    embedding_text,
    normalised,
)
from capabilities.corpus.fusion import min_max_blend, reciprocal_rank_fusion, relative_blend
from capabilities.corpus.schema import open_reader, open_writer
from capabilities.corpus.vectors import INDEX_KEY, drop_vectors, recorded_embedder, sync_index
from capabilities.corpus.writer import write_document
from tests.concepts import ConceptEmbeddingModel

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "corpus"
PARAPHRASE = "damp moisture coils"  # means "dew heaters" (notes.txt) and shares none of its words


def concepts(dimensions: int = 16) -> CorpusEmbedder:
    return corpus_embedder(ConceptEmbeddingModel(dimensions), name="test:concepts")


def ones(dimensions: int = 8, name: str = "test:ones") -> CorpusEmbedder:
    return corpus_embedder(TestEmbeddingModel(dimensions=dimensions), name=name)


def meta(path: Path) -> dict[str, str]:
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute("SELECT key, value FROM corpus_meta").fetchall())
    finally:
        conn.close()


def count(path: Path, table: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        conn.close()


@pytest.fixture
def hybrid(tmp_path: Path) -> Path:
    path = tmp_path / "hybrid.sqlite"
    ingest(path, FIXTURES, embedder=concepts())
    return path


def test_S1_ingest_records_the_embedder_and_a_vector_per_chunk(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    report = ingest(path, FIXTURES, embedder=ones())
    assert report.embedding is not None
    assert (report.embedding.model, report.embedding.dimensions) == ("test:ones", 8)
    assert report.embedding.embedded == count(path, "chunks") > 0
    assert meta(path)["embedder"] == '{"model":"test:ones","dimensions":8,"metric":"cosine"}'
    assert count(path, "chunk_vectors") == count(path, "chunks")
    assert count(path, "vector_index_parts") >= 1


def test_S1_a_corpus_without_an_embedder_stays_bm25_only(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    report = ingest(path, FIXTURES)
    assert report.embedding is None and "embedder" not in meta(path)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'chunk_vectors'").fetchone() is None
    conn.close()
    corpus = SQLiteCorpus(path, embedder=lambda model: pytest.fail(f"no embedder needed, asked for {model}"))
    assert not corpus.hybrid


async def test_S1_hybrid_search_finds_a_paraphrase_bm25_cannot(hybrid: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain.sqlite"
    ingest(plain, FIXTURES)
    bm25 = SQLiteCorpus(plain)
    assert await bm25.search(PARAPHRASE, limit=5, filter=None) == []
    await bm25.close()
    corpus = SQLiteCorpus(hybrid, embedder=concepts())
    try:
        results = await corpus.search(PARAPHRASE, limit=3, filter=None)
        assert "dew heaters" in results[0].content
        assert results[0].score >= results[-1].score
        lexical = await corpus.search("eyepiece case", limit=3, filter=None)
        assert "eyepiece case" in lexical[0].content
    finally:
        await corpus.close()


async def test_S1_the_query_is_embedded_once_per_search_as_a_query(hybrid: Path) -> None:
    model = ConceptEmbeddingModel()
    corpus = SQLiteCorpus(hybrid, embedder=corpus_embedder(model, name="test:concepts"))
    try:
        await corpus.search(PARAPHRASE, limit=3, filter=None)
        await corpus.search("eyepiece", limit=3, filter=None)
    finally:
        await corpus.close()
    assert model.calls == [("query", 1), ("query", 1)]


async def test_S1_a_filtered_hybrid_search_stays_in_its_document(hybrid: Path) -> None:
    corpus = SQLiteCorpus(hybrid, embedder=concepts())
    try:
        [notes] = [d for d in await corpus.list_documents(filter=None, offset=0, limit=10)
                   if d.uri.endswith("notes.txt")]
        results = await corpus.search(PARAPHRASE, limit=5, filter=notes.uri)
        assert results and {r.document_id for r in results} == {notes.id}
        assert await corpus.search(PARAPHRASE, limit=5, filter="no-such-document") == []
    finally:
        await corpus.close()


def test_S1_a_hybrid_corpus_refuses_to_open_without_its_embedder(hybrid: Path) -> None:
    with pytest.raises(EmbedderRequired, match="test:concepts"):
        SQLiteCorpus(hybrid)


def test_S1_a_hybrid_corpus_refuses_another_models_queries(hybrid: Path) -> None:
    with pytest.raises(EmbedderMismatch, match="'test:concepts', not 'test:ones'"):
        SQLiteCorpus(hybrid, embedder=ones(16))


def test_S1_an_embedder_lent_to_a_bm25_corpus_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    ingest(path, FIXTURES)
    with pytest.raises(NoVectors, match="--embedder test:ones"):
        SQLiteCorpus(path, embedder=ones())


def test_S1_the_resolver_is_asked_for_the_recorded_model(hybrid: Path) -> None:
    asked: list[str] = []

    def resolve(model: str) -> CorpusEmbedder:
        asked.append(model)
        return concepts()

    assert SQLiteCorpus(hybrid, embedder=resolve).hybrid
    assert asked == ["test:concepts"]


async def test_S1_query_vectors_of_the_wrong_length_are_refused(hybrid: Path) -> None:
    impostor = corpus_embedder(ConceptEmbeddingModel(dimensions=12), name="test:concepts")
    corpus = SQLiteCorpus(hybrid, embedder=impostor)
    try:
        with pytest.raises(EmbeddingError, match="12-dimensional .* 16-dimensional"):
            await corpus.search(PARAPHRASE, limit=3, filter=None)
    finally:
        await corpus.close()


async def test_S1_hybrid_search_works_on_a_read_only_file(hybrid: Path, tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    target = folder / "c.sqlite"
    shutil.copy(hybrid, target)
    os.chmod(target, stat.S_IREAD)
    os.chmod(folder, stat.S_IREAD | stat.S_IEXEC)
    try:
        corpus = SQLiteCorpus(target, embedder=concepts())
        results = await corpus.search(PARAPHRASE, limit=2, filter=None)
        await corpus.close()
        assert "dew heaters" in results[0].content
    finally:
        os.chmod(folder, stat.S_IRWXU)
        os.chmod(target, stat.S_IRUSR | stat.S_IWUSR)


def test_S2_changing_the_embedder_re_embeds_every_chunk(hybrid: Path) -> None:
    before = count(hybrid, "chunks")
    report = ingest(hybrid, FIXTURES, embedder=ones(8))
    assert report.embedding is not None and report.embedding.switched_from == "test:concepts"
    assert report.embedding.re_embedded == before and report.unchanged
    conn = sqlite3.connect(hybrid)
    lengths = {row[0] for row in conn.execute("SELECT length(vector) FROM chunk_vectors")}
    conn.close()
    assert lengths == {8 * 4}
    assert recorded_embedder(open_writer(hybrid)) is not None
    assert '"test:ones"' in meta(hybrid)["embedder"]


def test_S2_a_failed_re_embedding_leaves_the_old_vectors(hybrid: Path) -> None:
    class Failing(TestEmbeddingModel):
        calls = 0

        async def embed(self, inputs, *, input_type, settings=None):  # type: ignore[no-untyped-def]
            Failing.calls += 1
            if Failing.calls > 1:  # the probe passes, the re-embedding fails
                raise RuntimeError("provider went away")
            return await super().embed(inputs, input_type=input_type, settings=settings)

    before = meta(hybrid)["embedder"]
    with pytest.raises(RuntimeError, match="provider went away"):
        ingest(hybrid, FIXTURES, embedder=corpus_embedder(Failing(dimensions=8), name="test:failing"))
    assert meta(hybrid)["embedder"] == before
    conn = sqlite3.connect(hybrid)
    assert {row[0] for row in conn.execute("SELECT length(vector) FROM chunk_vectors")} == {16 * 4}
    conn.close()


def test_S2_a_hybrid_corpus_refuses_a_document_without_vectors(hybrid: Path) -> None:
    from capabilities.corpus.ingest import load_document

    loaded = load_document(FIXTURES / "handbook.md")
    assert loaded is not None
    record = loaded.record
    changed = type(record)(record.document, record.chunks, record.pictures, content_hash="changed")
    conn = open_writer(hybrid)
    before = count(hybrid, "chunks")
    with pytest.raises(EmbedderRequired):
        write_document(conn, changed)
    conn.close()
    assert count(hybrid, "chunks") == before
    with pytest.raises(EmbedderRequired):
        ingest(hybrid, FIXTURES)


def test_S2_re_ingest_without_changes_embeds_nothing(hybrid: Path) -> None:
    model = ConceptEmbeddingModel()
    report = ingest(hybrid, FIXTURES, embedder=corpus_embedder(model, name="test:concepts"))
    assert report.embedding is not None and report.embedding.embedded == 0
    assert model.calls == [("document", 1)]  # the probe only


def test_S2_dropping_the_embedder_makes_the_corpus_bm25_only(hybrid: Path) -> None:
    conn = open_writer(hybrid)
    assert drop_vectors(conn)
    conn.close()
    assert "embedder" not in meta(hybrid) and not SQLiteCorpus(hybrid).hybrid


def test_S5_a_dimension_change_under_the_same_name_is_refused_at_ingest(hybrid: Path) -> None:
    before = count(hybrid, "chunk_vectors")
    with pytest.raises(EmbeddingError, match="returned 8-dimensional vectors, but this corpus stores 16"):
        ingest(hybrid, FIXTURES, embedder=corpus_embedder(TestEmbeddingModel(dimensions=8), name="test:concepts"))
    assert count(hybrid, "chunk_vectors") == before


def test_S5_an_embedder_failing_its_probe_writes_nothing(tmp_path: Path) -> None:
    class Down(TestEmbeddingModel):
        async def embed(self, inputs, *, input_type, settings=None):  # type: ignore[no-untyped-def]
            raise ConnectionError("refused")

    path = tmp_path / "c.sqlite"
    with pytest.raises(ConnectionError):
        ingest(path, FIXTURES, embedder=corpus_embedder(Down(), name="test:down"))
    assert not path.exists(), "the corpus it would have created is not left behind (D2)"


def test_vectors_written_after_the_graph_are_searched_exactly(tmp_path: Path) -> None:
    """A stale graph (an ingest that stopped before syncing) is slower, never wrong."""
    path = tmp_path / "c.sqlite"
    ingest(path, FIXTURES / "handbook.md", embedder=concepts())
    graph_before = meta(path)[INDEX_KEY]
    from capabilities.corpus.embedded_ingest import VectorWriter
    from capabilities.corpus.ingest import load_document
    from capabilities.corpus.vectors import ChunkVectors

    loaded = load_document(FIXTURES / "notes.txt")
    assert loaded is not None
    record = loaded.record
    conn = open_writer(path)
    writer = VectorWriter.open(conn, concepts(), lambda p, r, v: None)
    texts = [embedding_text(record.document.title, c.headings, c.content) for c in record.chunks]
    matrix = writer._embed(texts)
    writer.runner.close()
    write_document(conn, record, ChunkVectors("test:concepts", matrix))
    conn.close()
    assert meta(path)[INDEX_KEY] == graph_before
    async def search() -> list[str]:
        corpus = SQLiteCorpus(path, embedder=concepts())
        try:
            return [r.content for r in await corpus.search(PARAPHRASE, limit=2, filter=None)]
        finally:
            await corpus.close()

    assert "dew heaters" in asyncio.run(search())[0]
    conn = open_writer(path)
    synced = sync_index(conn)
    conn.close()
    assert synced is not None and synced.count == count(path, "chunk_vectors")


def test_replaced_documents_leave_the_graph(hybrid: Path, tmp_path: Path) -> None:
    source = tmp_path / "docs"
    shutil.copytree(FIXTURES, source)
    path = tmp_path / "c.sqlite"
    ingest(path, source, embedder=concepts())
    (source / "notes.txt").write_text("Dew heaters were replaced.\n\nA second paragraph about lenses.\n")
    ingest(path, source, embedder=concepts())
    conn = open_writer(path)
    from capabilities.corpus.vectors import IndexMeta

    info = IndexMeta.model_validate_json(dict(conn.execute("SELECT key, value FROM corpus_meta").fetchall())[INDEX_KEY])
    conn.close()
    assert info.count == count(path, "chunk_vectors") == count(path, "chunks")


def test_the_graph_search_started_beside_bm25_ranks_as_the_exact_search(hybrid: Path) -> None:
    from capabilities.corpus.vectors import VectorIndexCache, nearest, start_graph_search

    conn = open_reader(hybrid)
    try:
        query = asyncio.run(concepts().embed_query(PARAPHRASE))
        loaded = VectorIndexCache().get(hybrid, conn)
        assert loaded is not None
        started = nearest(conn, loaded, query, 5, None, start_graph_search(loaded, query, 5))
        everything = (0, 2**62)
        exact = nearest(conn, None, query, 5, everything)
        assert started[0][0] == exact[0][0]  # chunks of equal cosine may come in either order
        assert [score for _, score in started] == pytest.approx([score for _, score in exact], abs=1e-3)
        assert started == nearest(conn, loaded, query, 5, None)
    finally:
        conn.close()


def test_the_graph_cache_loads_a_graph_once_and_never_serves_a_replaced_one(tmp_path: Path) -> None:
    from capabilities.corpus.vectors import VectorIndexCache

    source = tmp_path / "docs"
    shutil.copytree(FIXTURES, source)
    path = tmp_path / "c.sqlite"
    ingest(path, source, embedder=concepts())
    cache = VectorIndexCache()
    conn = open_reader(path)
    first = cache.get(path, conn)
    assert first is not None and cache.get(str(path), conn) is first  # the same file, named another way
    conn.close()
    (source / "notes.txt").write_text("Dew heaters were replaced.\n")
    ingest(path, source, embedder=concepts())
    conn = open_reader(path)
    replaced = cache.get(path, conn)
    conn.close()
    assert replaced is not None and replaced.meta.id != first.meta.id
    assert len(cache._loaded) == 1


def test_normalised_refuses_zero_and_short_answers() -> None:
    assert np.allclose(np.linalg.norm(normalised("m", [[3.0, 4.0]], 1), axis=1), 1.0)
    with pytest.raises(EmbeddingError, match="zero or non-finite"):
        normalised("m", [[0.0, 0.0]], 1)
    with pytest.raises(EmbeddingError, match="1 vectors for 2 texts"):
        normalised("m", [[1.0]], 2)


def test_embedding_text_puts_the_heading_path_first() -> None:
    assert embedding_text("Guide", ["Guide", "Fares"], "Text.") == "Guide > Fares\n\nText."
    assert embedding_text("Notes", [], "Text.") == "Notes\n\nText."


def test_reciprocal_rank_fusion_rewards_agreement() -> None:
    fused = reciprocal_rank_fusion([["a", "b", "c"], ["d", "b", "c"]])
    assert [item for item, _ in fused][0] == "b"
    with pytest.raises(ValueError, match="1 weights for 2 rankings"):
        reciprocal_rank_fusion([["a"], ["b"]], weights=[1.0])


def test_min_max_blend_keeps_a_clear_winner_first() -> None:
    lexical = [("exact", 30.0), ("near", 4.0), ("far", 3.0)]
    dense = [("near", 0.9), ("exact", 0.85), ("far", 0.1)]
    assert [item for item, _ in min_max_blend([lexical, dense], weights=[0.5, 0.5])] == ["exact", "near", "far"]
    assert min_max_blend([[], [("x", 0.2)]], weights=[0.5, 0.5]) == [("x", 0.5)]


def test_relative_blend_scores_bm25_against_the_best_match_and_cosines_as_they_are() -> None:
    lexical = [("exact", 30.0), ("near", 15.0)]
    dense = [("meaning", 0.6), ("exact", 0.3)]
    fused = dict(relative_blend(lexical, dense, weights=(0.3, 0.7)))
    assert fused == pytest.approx({"exact": 0.3 + 0.21, "near": 0.15, "meaning": 0.42})
    assert [item for item, _ in relative_blend(lexical, dense, weights=(0.3, 0.7))] == ["exact", "meaning", "near"]
    # a cosine spread of a few hundredths stays a few hundredths: min-max would make it the whole range
    close = [("a", 0.52), ("b", 0.50)]
    assert relative_blend([("b", 1.0)], close, weights=(0.3, 0.7))[0][0] == "b"
    assert relative_blend([], [("x", 0.2)], weights=(0.3, 0.7)) == [("x", pytest.approx(0.14))]
