"""The embedding seam: a pydantic-ai `Embedder` together with the name a corpus records for it.

A corpus's vectors only mean something next to queries embedded by the same model, so the corpus
records the model's name and dimensions (`EmbedderInfo`, the `embedder` corpus_meta key) and every
search embeds its query with an embedder of that name. Vectors are L2-normalised here, once, so
that cosine similarity is a dot product everywhere else.

Which provider, endpoint and key serve a name is the host's business (the worker reads its own
settings, worker/runtime/embedders.py); `corpus_embedder` covers pydantic-ai's provider strings
for library hosts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel
from pydantic_ai.embeddings import Embedder, EmbeddingModel

Vectors = npt.NDArray[np.float32]
"""One row per text, L2-normalised float32."""

EMBED_BATCH = 64
"""Texts per embedding request: large enough to amortise a hosted API's round trip, small enough
for every provider's per-request input limit and for a local model's memory."""


class EmbedderInfo(BaseModel):
    """What a corpus records about the embedder its vectors came from (corpus_meta `embedder`)."""

    model: str
    dimensions: int
    metric: Literal["cosine"] = "cosine"


class EmbeddingError(ValueError):
    """An embedder that answered, but not with vectors this corpus can use: a permanent error."""


class EmbedderRequired(EmbeddingError):
    """The corpus has vectors, so searching or writing it without its embedder would silently
    leave them out."""

    def __init__(self, info: EmbedderInfo) -> None:
        super().__init__(
            f"this corpus is searched with embedder {info.model!r} ({info.dimensions} dimensions); "
            "open it with that embedder (or ingest with `--embedder none` to make it BM25-only)"
        )


class EmbedderMismatch(EmbeddingError):
    """Vectors of two models are not comparable, so a corpus never mixes them (re-embed instead)."""

    def __init__(self, info: EmbedderInfo, model: str) -> None:
        super().__init__(
            f"this corpus was embedded with {info.model!r}, not {model!r}; queries must be embedded "
            "by the corpus's own model (ingest with `--embedder` to re-embed the corpus)"
        )


class NoVectors(EmbeddingError):
    """An embedder lent for a corpus that has no vectors would never be used: say so instead."""

    def __init__(self, model: str) -> None:
        super().__init__(
            f"this corpus has no vectors, so embedder {model!r} cannot search it; "
            f"ingest it with `--embedder {model}` first"
        )


def dimension_mismatch(model: str, expected: int, got: int) -> EmbeddingError:
    return EmbeddingError(
        f"embedder {model!r} returned {got}-dimensional vectors, but this corpus stores {expected}-dimensional "
        "ones: the model behind that name changed; re-embed the corpus (ingest with `--embedder`)"
    )


@dataclass
class CorpusEmbedder:
    """A pydantic-ai Embedder and the name a corpus records for it (`model`): the provider string
    (`openai:text-embedding-3-small`, `sentence-transformers:...`) or `openai-compatible:NAME`."""

    model: str
    embedder: Embedder
    batch_size: int = EMBED_BATCH

    async def embed_query(self, text: str) -> Vectors:
        """One query, as a normalised row vector."""
        result = await self.embedder.embed_query([text])
        return normalised(self.model, result.embeddings, 1)[0]

    async def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """Chunks, `batch_size` texts per request, as normalised rows in input order."""
        parts = []
        for start in range(0, len(texts), self.batch_size):
            batch = list(texts[start : start + self.batch_size])
            result = await self.embedder.embed_documents(batch)
            parts.append(normalised(self.model, result.embeddings, len(batch)))
        if not parts:
            return np.zeros((0, 0), dtype=np.float32)
        if len({part.shape[1] for part in parts}) > 1:
            raise EmbeddingError(f"embedder {self.model!r} returned vectors of different lengths in one run")
        return np.concatenate(parts)


EmbedderResolver = Callable[[str], CorpusEmbedder]
"""A host's way to build the embedder a corpus names (the worker's: its settings decide the
endpoint and key)."""


def corpus_embedder(model: str | EmbeddingModel, *, name: str | None = None) -> CorpusEmbedder:
    """An embedder from a pydantic-ai provider string (keys from the provider's usual variables),
    or from a model instance under the `name` the corpus should record."""
    if isinstance(model, EmbeddingModel):
        if name is None:
            raise ValueError("an EmbeddingModel instance needs the name the corpus records for it (name=...)")
        return CorpusEmbedder(name, Embedder(model))
    return CorpusEmbedder(name or model, Embedder(model, defer_model_check=False))


def normalised(model: str, embeddings: Sequence[Sequence[float]], expected: int) -> Vectors:
    """Checks the provider's answer (one finite, non-zero vector per input) and scales each row to
    unit length: a zero or NaN vector would rank arbitrarily, so it is refused, not stored."""
    if len(embeddings) != expected:
        raise EmbeddingError(f"embedder {model!r} returned {len(embeddings)} vectors for {expected} texts")
    try:
        matrix = np.asarray(embeddings, dtype=np.float32)
    except ValueError as exc:
        raise EmbeddingError(f"embedder {model!r} returned vectors of different lengths") from exc
    if matrix.ndim != 2 or matrix.shape[1] == 0:
        raise EmbeddingError(f"embedder {model!r} returned no vector components")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    if not np.all(np.isfinite(norms)) or np.any(norms == 0):
        raise EmbeddingError(f"embedder {model!r} returned a zero or non-finite vector")
    return (matrix / norms).astype(np.float32)


def embedding_text(title: str | None, headings: Sequence[str], content: str) -> str:
    """What is embedded for a chunk: its place in the document, then its text. A chunk's words
    rarely repeat its section's subject, which the heading path states."""
    path = [h for h in headings if h]
    if title and (not path or path[0] != title):
        path.insert(0, title)
    return f"{' > '.join(path)}\n\n{content}" if path else content
