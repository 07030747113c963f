"""The SQLite knowledge base behind `CorpusStore`: `ingest()` fills a corpus file from PDF, DOCX,
Markdown, reStructuredText, HTML and plain text with their pictures (and, given an embedder,
their vectors), and `SQLiteCorpus` serves it to evidence capabilities: BM25 alone, or fused with
vector neighbours when the corpus records an embedder (docs/design/rules/search.md).

The names below are what hosts use; everything else in the package is internal.
"""

from .embedded_ingest import EmbeddingProgress, EmbeddingSummary
from .embedding import CorpusEmbedder, EmbeddingError
from .formats.options import ReadOptions
from .ingest import ingest
from .report import IngestReport
from .schema import NotACorpusError, open_reader, open_writer
from .sqlite import SQLiteCorpus
from .summary import CorpusSummary, DocumentSummary, summarize
from .vectors import VectorIndexCache, drop_vectors, recorded_embedder

__all__ = [
    "CorpusEmbedder",
    "CorpusSummary",
    "DocumentSummary",
    "EmbeddingError",
    "EmbeddingProgress",
    "EmbeddingSummary",
    "IngestReport",
    "NotACorpusError",
    "ReadOptions",
    "SQLiteCorpus",
    "VectorIndexCache",
    "drop_vectors",
    "ingest",
    "open_reader",
    "open_writer",
    "recorded_embedder",
    "summarize",
]
