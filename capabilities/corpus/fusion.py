"""Fusing the BM25 and vector rankings into one.

Served: a relative blend (`relative_blend`). BM25 scores are unbounded and depend on the query, so
each is divided by the query's best one (the best lexical match scores 1, a chunk half as good
0.5); cosines already lie on the model's fixed scale and are used as they are. The two are summed
with weights 0.3 (BM25) and 0.7 (vectors). Chosen on the retrieval set's dev half
(bench/retrieval.py prints the alternatives side by side), where it beat both earlier choices:

- reciprocal-rank fusion throws away how far ahead the top candidate is, and a BM25 hit that
  matches every rare word of a lexical question is far ahead;
- the min-max blend served before scaled each side to [0, 1] within its candidates, which
  stretches a cosine spread of a few hundredths between the 1st and the 50th candidate to the
  whole range, and makes the blend depend on how many candidates were fetched.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)

FUSION_WEIGHTS = (0.3, 0.7)
"""BM25, then vectors, for `relative_blend`: on the dev half 0.2 to 0.4 for BM25 found the same
paraphrased questions in the top 5 and every lexical one first; 0.5 and more lost paraphrased ones."""

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


def relative_blend(
    lexical: Sequence[tuple[K, float]], semantic: Sequence[tuple[K, float]], *, weights: tuple[float, float]
) -> list[tuple[K, float]]:
    """BM25 (item, score) pairs divided by the best score, plus (item, cosine) pairs as they are,
    weighted and summed (an item a side did not return gets 0 from it), best first; ties keep
    the order of first appearance."""
    totals: dict[K, float] = {}
    best = max((score for _, score in lexical), default=0.0)
    for item, score in lexical:
        totals[item] = weights[0] * (score / best if best > 0 else 1.0)
    for item, cosine in semantic:
        totals[item] = totals.get(item, 0.0) + weights[1] * cosine
    return sorted(totals.items(), key=lambda pair: -pair[1])
