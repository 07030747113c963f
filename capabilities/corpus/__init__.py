"""The SQLite knowledge base behind `CorpusStore`: `ingest()` fills a corpus file from Markdown,
text and HTML with their pictures, and `SQLiteCorpus` serves it to evidence capabilities."""

from .ingest import IngestReport, ingest
from .schema import NotACorpusError
from .sqlite import SQLiteCorpus

__all__ = ["IngestReport", "NotACorpusError", "SQLiteCorpus", "ingest"]
