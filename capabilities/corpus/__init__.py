"""The SQLite knowledge base behind `CorpusStore`: `ingest()` fills a corpus file from Markdown,
text and HTML with their pictures (and, given an embedder, their vectors), and `SQLiteCorpus`
serves it to evidence capabilities: BM25 alone, or fused with vector neighbours when the corpus
records an embedder (docs/design/rules/search.md).

The names below are what hosts use; everything else in the package is internal.
"""

from .embedded_ingest import EmbeddingProgress, EmbeddingSummary
from .embedding import CorpusEmbedder, EmbeddingError
from .ingest import IngestReport, ingest
from .schema import NotACorpusError, open_reader, open_writer
from .sqlite import SQLiteCorpus
from .vectors import VectorIndexCache, drop_vectors, recorded_embedder

__all__ = [
    "CorpusEmbedder",
    "EmbeddingError",
    "EmbeddingProgress",
    "EmbeddingSummary",
    "IngestReport",
    "NotACorpusError",
    "SQLiteCorpus",
    "VectorIndexCache",
    "drop_vectors",
    "ingest",
    "open_reader",
    "open_writer",
    "recorded_embedder",
]
