"""Fusing the BM25 and vector rankings into one.

Served: a min-max blend. Each side's candidate scores are scaled to [0, 1] within the query (BM25
scores are unbounded and query-dependent, cosines model-dependent, so neither is used raw) and
summed with equal weights. On the retrieval set's dev half it beat reciprocal-rank fusion
(k=60 and k=20, with and without a dense weight) on paraphrased and lexical questions alike:
RRF throws away how far ahead the top candidate is, and a BM25 hit that matches every rare word
of a lexical question is far ahead (bench/retrieval.py prints the alternatives side by side).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)

FUSION_WEIGHTS = (0.5, 0.5)
"""BM25, then vectors: chosen on the dev half (0.3/0.7 lost lexical and paraphrased questions)."""

RRF_K = 60
"""The usual constant: it flattens the gap between rank 1 and rank 10, so a chunk that both
rankings place fairly high beats one that only one ranking places first."""


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[K]], *, k: int = RRF_K, weights: Sequence[float] | None = None
) -> list[tuple[K, float]]:
    """Items of every ranking (best first) with their fused score, best first; ties keep the
    order of first appearance, so the result is deterministic."""
    weights = weights or [1.0] * len(rankings)
    if len(weights) != len(rankings):
        raise ValueError(f"{len(weights)} weights for {len(rankings)} rankings")
    scores: dict[K, float] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + weight / (k + rank)
    return sorted(scores.items(), key=lambda pair: -pair[1])


def min_max_blend(
    scored: Sequence[Sequence[tuple[K, float]]], *, weights: Sequence[float]
) -> list[tuple[K, float]]:
    """Each ranking's (item, score) pairs scaled to [0, 1] and summed with weights (an item a
    ranking did not return gets 0 from it), best first; ties keep the order of first appearance."""
    totals: dict[K, float] = {}
    for ranking, weight in zip(scored, weights, strict=True):
        if not ranking:
            continue
        values = [score for _, score in ranking]
        low, high = min(values), max(values)
        for item, score in ranking:
            scaled = 1.0 if high == low else (score - low) / (high - low)
            totals[item] = totals.get(item, 0.0) + weight * scaled
    return sorted(totals.items(), key=lambda pair: -pair[1])
