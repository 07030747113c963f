"""`grounded ingest --embedder`: which embedder an ingest uses, its progress, and its report lines.

An ingest embeds with the same resolution a worker uses (runtime/embedders.py), so the model a
corpus records is one the workers can build from their own settings.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic_ai.exceptions import ModelAPIError
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from capabilities.corpus import CorpusEmbedder, EmbeddingProgress, EmbeddingSummary
from worker.runtime.embedders import EMBEDDER_FAILURES, INGEST_SDK_RETRIES, EmbedderCache
from worker.settings import Settings

NONE = "none"


class IngestFailure:
    """The errors an ingest with an embedder reports in one line (nothing else was changed, or the
    documents before the failure are complete)."""

    causes = EMBEDDER_FAILURES

    @staticmethod
    def describe(exc: BaseException) -> str:
        if isinstance(exc, ModelAPIError):
            return (f"ingest stopped: the embedder failed ({type(exc).__name__}: {exc}); documents written "
                    "before the failure are complete; run the same command again to continue")
        return f"ingest stopped: {exc}"


def chosen_embedder(target: Path, name: str | None, settings: Settings) -> CorpusEmbedder | None:
    """`--embedder MODEL`, or the corpus's own when none is given (so a hybrid corpus stays
    hybrid); `--embedder none` drops the corpus's vectors first."""
    from capabilities.corpus import drop_vectors, open_reader, open_writer, recorded_embedder

    if name == NONE:
        if target.exists():
            conn = open_writer(target)
            try:
                drop_vectors(conn)
            finally:
                conn.close()
        return None
    if name is None:
        if not target.exists():
            return None
        conn = open_reader(target)
        try:
            info = recorded_embedder(conn)
        finally:
            conn.close()
        if info is None:
            return None
        name = info.model
    return EmbedderCache.from_settings(settings, max_retries=INGEST_SDK_RETRIES).get(name)


@contextlib.contextmanager
def progress_display(
    console: Console, embedder: CorpusEmbedder | None
) -> Iterator[Callable[[EmbeddingProgress], None] | None]:
    """A live line per phase: a bar while stored chunks are re-embedded, a count for new ones."""
    if embedder is None:
        yield None
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[rate]}"),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        tasks: dict[str, TaskID] = {}

        def report(step: EmbeddingProgress) -> None:
            if step.phase not in tasks:
                tasks[step.phase] = bar.add_task(f"{step.phase} with {embedder.model}", total=step.total, rate="")
            rate = f"{step.embedded / step.elapsed_s:,.0f} chunks/s" if step.elapsed_s > 0 else ""
            bar.update(tasks[step.phase], completed=step.embedded, total=step.total, rate=rate)

        yield report


def embedding_lines(summary: EmbeddingSummary | None) -> list[str]:
    if summary is None:
        return ["search: BM25 only (no embedder; `--embedder MODEL` adds vectors for hybrid search)"]
    lines = [f"search: hybrid, embedder {summary.model} ({summary.dimensions} dimensions)"]
    if summary.re_embedded or summary.switched_from:
        was = f", replacing {summary.switched_from}" if summary.switched_from else ""
        lines.append(f"re-embedded {summary.re_embedded} stored chunks{was}")
    done = summary.re_embedded + summary.embedded
    lines.append(f"embedded {done} chunks in {summary.seconds:.1f} s ({summary.chunks_per_s:,.0f} chunks/s)")
    return lines
