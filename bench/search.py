"""Search latency of the SQLite corpus at 1k, 10k and 100k chunks.

Corpora are synthetic but shaped like text: words follow a Zipf distribution whose most
frequent ranks are real English stopwords, and queries are drawn from the same distribution
(so, like questions, they contain stopwords that search drops). They are written through
`capabilities.corpus.writer.write_document`, the path ingest uses, without making files.
Every latency is one `SQLiteCorpus.search` call as an evidence capability makes it (thread
hop, SQL, result models), measured from a warm cache.

Run: `.venv/bin/python -m bench.search`. Building the 100k-chunk corpora (and above all the vector
graph) takes minutes; with `BENCH_SEARCH_CORPORA=FOLDER` they are built into FOLDER once and
reused by later runs (delete the folder after changing how corpora are written or indexed).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic_ai.embeddings import EmbeddingModel, EmbeddingResult, EmbeddingSettings
from pydantic_ai.embeddings.result import EmbedInputType

from capabilities.corpus import SQLiteCorpus
from capabilities.corpus.embedding import CorpusEmbedder, EmbedderInfo, corpus_embedder
from capabilities.corpus.query import STOPWORDS
from capabilities.corpus.schema import open_writer
from capabilities.corpus.vectors import begin_staging, stage_vectors, switch_embedder, sync_index
from capabilities.corpus.writer import (
    DocumentRecord,
    chunk_id_for,
    document_id_for,
    write_document,
)
from capabilities.store import Chunk, Document

SIZES = (1_000, 10_000, 100_000)
QUERIES = 200
WARMUP_QUERIES = 20
SEARCH_LIMIT = 5
CHUNKS_PER_DOCUMENT = 100
WORDS_PER_CHUNK = 110
"""About 800 characters, the chunker's target size."""
SYNTHETIC_WORDS = 20_000
GOAL_P50_MS = 5.0
"""Search p50 at 100k chunks; it binds the smaller corpora too."""
HYBRID_GOAL_P50_MS = 15.0
HYBRID_GOAL_P95_MS = 40.0
"""Hybrid search at 100k chunks, excluding the query-embedding call (bench/retrieval.py times that)."""
DIMENSIONS = 384
"""all-MiniLM-L6-v2's, the model bench/retrieval.py uses."""
SEED = 20_240_601
KEEP_ENV = "BENCH_SEARCH_CORPORA"
_SYLLABLES = "ka lo mi ren tas vo quil bar den fi gor hu jin kel mar nos pel ru sol tim ul vek wan yor zed".split()


def vocabulary(rng: random.Random) -> tuple[list[str], list[float]]:
    """Words with cumulative Zipf weights: stopwords take the most frequent ranks."""
    words = sorted(STOPWORDS)
    seen = set(words)
    while len(words) < len(STOPWORDS) + SYNTHETIC_WORDS:
        word = "".join(rng.choices(_SYLLABLES, k=rng.randint(2, 4)))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words, list(itertools.accumulate(1.0 / rank for rank in range(1, len(words) + 1)))


def build_corpus(
    path: Path, n_chunks: int, words: Sequence[str], cum_weights: Sequence[float], rng: random.Random
) -> None:
    conn = open_writer(path)
    try:
        for first in range(0, n_chunks, CHUNKS_PER_DOCUMENT):
            uri = f"bench://corpus/{first // CHUNKS_PER_DOCUMENT:05}"
            document = Document(id=document_id_for(uri), uri=uri, title=f"Synthetic {first // CHUNKS_PER_DOCUMENT}")
            chunks = []
            for ordinal in range(min(CHUNKS_PER_DOCUMENT, n_chunks - first)):
                content = " ".join(rng.choices(words, cum_weights=cum_weights, k=WORDS_PER_CHUNK))
                heading = " ".join(rng.choices(words, cum_weights=cum_weights, k=3))
                chunks.append(
                    Chunk(
                        id=chunk_id_for(uri, ordinal, f"{n_chunks}-{first}-{ordinal}"),
                        document_id=document.id,
                        ordinal=ordinal,
                        content=content,
                        headings=[document.title or "", heading],
                        page_numbers=[ordinal // 4 + 1],
                        labels=["text"],
                    )
                )
            write_document(conn, DocumentRecord(document, chunks, [], content_hash=uri))
    finally:
        conn.close()


class ReadyVectors(EmbeddingModel):
    """Answers every query with the next of a fixed set of random unit vectors, in microseconds,
    so the hybrid latency measured is the search's own (the query-embedding call is timed apart)."""

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        self.rng = rng

    @property
    def model_name(self) -> str:
        return "ready"

    @property
    def system(self) -> str:
        return "bench"

    async def embed(
        self, inputs: str | Sequence[str], *, input_type: EmbedInputType, settings: EmbeddingSettings | None = None
    ) -> EmbeddingResult:
        texts, _ = self.prepare_embed(inputs, settings)
        vectors = self.rng.standard_normal((len(texts), DIMENSIONS), dtype=np.float32)
        return EmbeddingResult(vectors.tolist(), inputs=texts, input_type=input_type, model_name="ready",
                               provider_name="bench")


def add_vectors(path: Path, rng: np.random.Generator) -> float:
    """Random unit vectors for every chunk, switched in as an embedder's would be; returns the
    seconds the graph took to build."""
    conn = open_writer(path)
    try:
        seqs = [row[0] for row in conn.execute("SELECT seq FROM chunks ORDER BY seq")]
        begin_staging(conn)
        for start in range(0, len(seqs), 10_000):
            batch = seqs[start : start + 10_000]
            matrix = rng.standard_normal((len(batch), DIMENSIONS), dtype=np.float32)
            stage_vectors(conn, batch, matrix / np.linalg.norm(matrix, axis=1, keepdims=True))
        switch_embedder(conn, EmbedderInfo(model="bench:ready", dimensions=DIMENSIONS))
        began = time.perf_counter()
        sync_index(conn)
        return time.perf_counter() - began
    finally:
        conn.close()


def queries(words: Sequence[str], cum_weights: Sequence[float], rng: random.Random) -> list[str]:
    return [" ".join(rng.choices(words, cum_weights=cum_weights, k=rng.randint(3, 7))) for _ in range(QUERIES)]


async def latencies_ms(path: Path, texts: Sequence[str], *, scoped: bool = False, expand: bool = False,
                       embedder: CorpusEmbedder | None = None) -> list[float]:
    store = SQLiteCorpus(path, embedder=embedder)
    try:
        scope = document_id_for("bench://corpus/00000") if scoped else None
        for text in texts[:WARMUP_QUERIES]:
            await store.search(text, limit=SEARCH_LIMIT, filter=scope)
        timings = []
        for text in texts:
            start = time.perf_counter()
            results = await store.search(text, limit=SEARCH_LIMIT, filter=scope)
            if expand:
                await store.expand_context(results)
            timings.append((time.perf_counter() - start) * 1000)
        return timings
    finally:
        await store.close()


async def side_by_side_ms(plain: Path, hybrid: Path, embedder: CorpusEmbedder,
                          texts: Sequence[str]) -> dict[str, list[float]]:
    """BM25-only and hybrid searches of the same chunks, alternating query by query (which goes
    first rotates), so the machine's other load hits both alike; with the process CPU time of
    each hybrid search (every thread: its graph search runs beside its BM25 ranking)."""
    stores = {"bm25": SQLiteCorpus(plain), "hybrid": SQLiteCorpus(hybrid, embedder=embedder)}
    out: dict[str, list[float]] = {"bm25": [], "hybrid": [], "hybrid_cpu": []}
    try:
        for text in texts[:WARMUP_QUERIES]:
            for store in stores.values():
                await store.search(text, limit=SEARCH_LIMIT, filter=None)
        for i, text in enumerate(texts):
            for name in ("bm25", "hybrid") if i % 2 == 0 else ("hybrid", "bm25"):
                start, cpu = time.perf_counter(), time.process_time()
                await stores[name].search(text, limit=SEARCH_LIMIT, filter=None)
                out[name].append((time.perf_counter() - start) * 1000)
                if name == "hybrid":
                    out["hybrid_cpu"].append((time.process_time() - cpu) * 1000)
        return out
    finally:
        for store in stores.values():
            await store.close()


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def row(name: str, measured: float, goal: float | None) -> dict[str, Any]:
    """One benchmark line; `ratio` is measured/goal, so 1.0 or less passes."""
    ratio = None if goal is None else measured / goal
    status = "info" if ratio is None else ("pass" if ratio <= 1.0 else "short")
    return {"name": name, "measured": round(measured, 3), "unit": "ms", "goal": goal,
            "ratio": None if ratio is None else round(ratio, 3), "status": status}


def run() -> list[dict[str, Any]]:
    """Builds each corpus in a temporary folder (or the kept one, see KEEP_ENV), measures it, and
    deletes it unless kept."""
    kept = os.environ.get(KEEP_ENV)
    if kept:
        Path(kept).mkdir(parents=True, exist_ok=True)
        return measure(Path(kept))
    with tempfile.TemporaryDirectory(prefix="bench-search-") as folder:
        return measure(Path(folder))


def measure(folder: Path) -> list[dict[str, Any]]:
    rng = random.Random(SEED)
    words, cum_weights = vocabulary(rng)
    texts = queries(words, cum_weights, rng)
    rows: list[dict[str, Any]] = []
    built = all((folder / f"corpus-{size}.db").exists() for size in SIZES)
    for size in SIZES:
        path = folder / f"corpus-{size}.db"
        if not built:  # all sizes or none: they draw from one random sequence, in this order
            path.unlink(missing_ok=True)
            build_corpus(path, size, words, cum_weights, rng)
        plain = asyncio.run(latencies_ms(path, texts))
        label = f"{size // 1000}k chunks"
        rows.append(row(f"search p50, {label}", statistics.median(plain), GOAL_P50_MS))
        rows.append(row(f"search p95, {label}", percentile(plain, 0.95), None))
        if size == SIZES[-1]:
            expanded = asyncio.run(latencies_ms(path, texts, expand=True))
            scoped = asyncio.run(latencies_ms(path, texts, scoped=True))
            rows.append(row(f"search + expand_context p50, {label}", statistics.median(expanded), None))
            rows.append(row(f"search in one document p50, {label}", statistics.median(scoped), None))
            rows += hybrid_rows(path, hybrid_corpus(path), texts, label)
    return rows


def hybrid_corpus(plain: Path) -> tuple[Path, float]:
    """A copy of the corpus with vectors and their graph, and the seconds the graph took (recorded
    beside a kept corpus, whose graph is not built again)."""
    path = plain.with_name(f"{plain.stem}-hybrid.db")
    record = path.with_suffix(".json")
    if not record.exists() or record.stat().st_mtime < plain.stat().st_mtime:
        for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            leftover.unlink(missing_ok=True)
        shutil.copy(plain, path)
        build_s = add_vectors(path, np.random.default_rng(SEED))
        record.write_text(json.dumps({"graph_build_s": build_s}))
    return path, float(json.loads(record.read_text())["graph_build_s"])


def hybrid_rows(plain: Path, corpus: tuple[Path, float], texts: Sequence[str], label: str) -> list[dict[str, Any]]:
    path, build_s = corpus
    embedder = corpus_embedder(ReadyVectors(np.random.default_rng(SEED + 1)), name="bench:ready")
    timings = asyncio.run(side_by_side_ms(plain, path, embedder, texts))
    scoped = asyncio.run(latencies_ms(path, texts, scoped=True, embedder=embedder))
    size_mb = path.stat().st_size / 1e6
    return [
        row(f"hybrid search p50, {label}, {DIMENSIONS} dims (query embedding excluded)",
            statistics.median(timings["hybrid"]), HYBRID_GOAL_P50_MS),
        row(f"hybrid search p95, {label}, {DIMENSIONS} dims (query embedding excluded)",
            percentile(timings["hybrid"], 0.95), HYBRID_GOAL_P95_MS),
        row("↳ BM25-only search p50, same chunks, alternating query by query with the line above",
            statistics.median(timings["bm25"]), None) | {"note": f"p95 {percentile(timings['bm25'], 0.95):.1f} ms"},
        row("↳ hybrid search CPU time p50, every thread of the process",
            statistics.median(timings["hybrid_cpu"]), None) | {"note": f"p95 {percentile(timings['hybrid_cpu'], 0.95):.1f} ms"},
        row(f"hybrid search in one document p50, {label} (exact vectors)", statistics.median(scoped), None),
        {**row(f"vector graph build, {label}, {DIMENSIONS} dims (HNSW, f16)", build_s, None), "unit": "s"},
        {**row(f"corpus file with vectors and graph, {label}", size_mb, None), "unit": "MB"},
    ]


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| benchmark | measured | goal | ratio | status |", "|---|---:|---:|---:|---|"]
    for r in rows:
        goal = "" if r["goal"] is None else f"≤ {r['goal']:g} {r['unit']}"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(f"| {r['name']} | {r['measured']:.2f} {r['unit']} | {goal} | {ratio} | {r['status']} |")
    return "\n".join(lines)


def main() -> None:
    start = time.perf_counter()
    rows = run()
    print(markdown_table(rows))
    print(f"\n{QUERIES} queries of 3-7 words, limit {SEARCH_LIMIT}; total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
