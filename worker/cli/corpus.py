"""`grounded ingest` and `grounded corpus list|show|search`: filling a corpus and looking inside it.

Thin shells over `capabilities.corpus` (ingest, summary, search). Everything printed that came
from a corpus or a file name is escaped, since Rich would read `[bcf70dce]` in a chunk id or a
heading as markup and drop it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from worker.settings import get_settings

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from capabilities.corpus import IngestReport
    from worker.interfaces.search import SearchHit

console = Console()
err = Console(stderr=True)

EXIT_CODES = {"complete": 0, "partial": 1, "nothing": 2}
"""D2. 0: every file went in, was unchanged, or is no document (skipped); 1: some failed, and
they are listed; 2: nothing could be ingested (and no corpus file was left behind)."""
PROGRESS_MIN_FILES = 20
PROGRESS_MIN_BYTES = 2 * 1024 * 1024
"""A progress bar appears once an ingest has this many files, or meets a file this large."""
SNIPPET_CHARS = 160

corpus_app = typer.Typer(name="corpus", help="Look inside the corpora under DATA_DIR/corpora.", no_args_is_help=True)


def _fail(message: str, code: int) -> NoReturn:
    """One red line on stderr; the message may quote a name or a path, so it is escaped."""
    err.print(f"[red]{escape(message)}[/]", soft_wrap=True)
    raise typer.Exit(code)


def _corpus_file(name: str) -> Path:
    from worker.jobs.composition import CompositionError, corpus_path

    try:
        return corpus_path(get_settings().corpora_dir, name)
    except CompositionError as exc:
        _fail(str(exc), 2)


class IngestProgress:
    """A transient bar on stderr, started only for a large ingest (and only on a terminal)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar: Progress | None = None
        self.task: TaskID | None = None

    def __call__(self, done: int, total: int, current: Path | None) -> None:
        if self.bar is None and current is not None and (total >= PROGRESS_MIN_FILES or _size(current) >= PROGRESS_MIN_BYTES):
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeRemainingColumn(), console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task("ingesting", total=total)
        if self.bar is not None and self.task is not None:
            name = escape(current.name) if current is not None else "done"
            self.bar.update(self.task, completed=done, description=f"ingesting {name}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _print_report(report: IngestReport, *, verbose: bool) -> None:
    console.print(escape(report.summary()), highlight=False, soft_wrap=True)
    for problem in report.failed:
        err.print(f"[red]failed[/] {escape(str(problem))}", highlight=False, soft_wrap=True)
    if verbose:
        for problem in report.skipped:
            err.print(f"[dim]skipped[/] {escape(str(problem))}", highlight=False, soft_wrap=True)
        for problem in report.warnings:
            err.print(f"[yellow]picture left out[/] {escape(str(problem))}", highlight=False, soft_wrap=True)
        for path in report.pruned:
            err.print(f"[dim]pruned[/] {escape(path)}", highlight=False, soft_wrap=True)
    if report.outcome == "nothing":
        where = "no corpus file was written" if report.corpus_removed else f"{report.corpus} is unchanged"
        err.print(f"[red]nothing could be ingested[/]: {escape(where)}", highlight=False, soft_wrap=True)
    elif report.journal_mode != "delete":
        err.print("[yellow]note[/]: a reader had the corpus open, so it stays in WAL mode; a read-only mount "
                  "opens it immutable until the next ingest finishes with no reader", highlight=False, soft_wrap=True)


def ingest(
    paths: Annotated[list[Path], typer.Argument(help="files or folders: PDF, DOCX, Markdown, reST, HTML, text, "
                                                     "each also .gz; text files without an extension")],
    corpus: Annotated[str, typer.Option("--corpus", help="the name jobs use for this corpus")],
    embedder: Annotated[
        str | None,
        typer.Option("--embedder", help="embedding model for hybrid search (openai:text-embedding-3-small, "
                     "openai-compatible:NAME, sentence-transformers:NAME, ...); `none` makes the corpus BM25-only; "
                     "default: the corpus's own"),
    ] = None,
    prune: Annotated[bool, typer.Option("--prune", help="remove documents whose file is gone from a given folder")]
    = False,
    page_images: Annotated[bool, typer.Option("--page-images/--no-page-images",
                                              help="keep each PDF page's image as its picture (for vision)")] = True,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="list skipped files, left-out pictures, "
                                                                 "pruned documents")] = False,
    report_file: Annotated[Path | None, typer.Option("--report", help="write every file's outcome here (JSON)")]
    = None,
) -> None:
    """Ingest documents into DATA_DIR/corpora/NAME.sqlite (created if missing). One summary line;
    failures listed; exit 0 (all in), 1 (some failed, or the embedder stopped it), 2 (nothing
    ingested)."""
    import sqlite3

    from capabilities.corpus import NotACorpusError, ReadOptions
    from capabilities.corpus import ingest as ingest_files
    from worker.jobs.composition import CompositionError, check_corpus_name

    from .embedding import IngestFailure, chosen_embedder, embedding_lines, progress_display

    settings = get_settings()
    try:
        check_corpus_name(corpus)
    except CompositionError as exc:
        _fail(str(exc), 2)
    settings.corpora_dir.mkdir(parents=True, exist_ok=True)
    target = settings.corpora_dir / f"{corpus}.sqlite"
    progress = IngestProgress(err)
    try:
        chosen = chosen_embedder(target, embedder, settings)
        with progress_display(console, chosen) as embedding_progress:
            # one live display at a time: with an embedder its batches show the progress
            report = ingest_files(target, paths, options=ReadOptions(page_images=page_images), prune=prune,
                                  on_progress=progress if chosen is None else None, embedder=chosen,
                                  embedding_progress=embedding_progress)
    except IngestFailure.causes as exc:
        progress.close()
        err.print(f"[red]{escape(IngestFailure.describe(exc))}[/]", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except (NotACorpusError, sqlite3.Error) as exc:
        progress.close()
        why = f"it is not a corpus ({exc.problem}); move it away or choose another --corpus" \
            if isinstance(exc, NotACorpusError) else str(exc)
        err.print(f"[red]cannot ingest into {escape(str(target))}[/]: {escape(why)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    progress.close()
    _print_report(report, verbose=verbose)
    for line in [] if report.corpus_removed else embedding_lines(report.embedding):
        console.print(escape(line), highlight=False, soft_wrap=True)
    if report_file is not None:
        report_file.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    raise typer.Exit(EXIT_CODES[report.outcome])


@corpus_app.command("list")
def list_corpora() -> None:
    """Every corpus a worker with this DATA_DIR serves, with its size."""
    from capabilities.corpus import NotACorpusError, summarize
    from worker.jobs.composition import known_corpora

    corpora_dir = get_settings().corpora_dir
    names = known_corpora(corpora_dir)
    if not names:
        console.print(f"no corpora in {escape(str(corpora_dir))}; fill one with `grounded ingest PATH --corpus NAME`",
                      highlight=False)
        return
    table = Table(title=escape(str(corpora_dir)))
    for column in ("corpus", "documents", "pages", "chunks", "formats", "size"):
        table.add_column(column, justify="left" if column in ("corpus", "formats") else "right")
    for name in names:
        try:
            found = summarize(corpora_dir / f"{name}.sqlite")
        except (NotACorpusError, OSError) as exc:
            table.add_row(escape(name), "", "", "", f"[red]{escape(str(exc))}[/]", "")
            continue
        formats = ", ".join(f"{fmt} {n:,}" for fmt, n in found.formats.items())
        table.add_row(escape(name), f"{found.documents:,}", f"{found.pages:,}", f"{found.chunks:,}", escape(formats),
                      _megabytes(found.size_bytes))
    console.print(table)


def _megabytes(size: int) -> str:
    return f"{size / 2**20:,.1f} MB"


@corpus_app.command()
def show(
    name: Annotated[str, typer.Argument(help="corpus name")],
    documents: Annotated[int, typer.Option("-n", "--documents", help="documents to list (uri order)")] = 50,
) -> None:
    """Counts (documents, pages, chunks, pictures, formats, embedder) and the documents."""
    from capabilities.corpus import NotACorpusError, summarize

    path = _corpus_file(name)
    try:
        found = summarize(path, list_documents=documents)
    except NotACorpusError as exc:
        _fail(str(exc), 2)
    facts = Table(title=escape(f"corpus {name}"), show_header=False)
    facts.add_row("file", escape(found.path))
    facts.add_row("size", _megabytes(found.size_bytes))
    for label, value in (("documents", found.documents), ("pages", found.pages), ("chunks", found.chunks),
                         ("pictures", found.pictures)):
        facts.add_row(label, f"{value:,}")
    facts.add_row("formats", escape(", ".join(f"{fmt} {n:,}" for fmt, n in found.formats.items()) or "none"))
    facts.add_row("embedder", escape(found.embedder or "none (full-text search only)"))
    console.print(facts)
    if not found.listed:
        return
    table = Table(title=f"documents ({len(found.listed):,} of {found.documents:,})")
    for column in ("title", "format", "pages", "chunks", "pictures", "id", "uri"):
        table.add_column(column, justify="right" if column in ("pages", "chunks", "pictures") else "left")
    for document in found.listed:
        table.add_row(escape(document.title or ""), escape(document.format), f"{document.pages:,}",
                      f"{document.chunks:,}", f"{document.pictures:,}", escape(document.id), escape(document.uri))
    console.print(table)


@corpus_app.command()
def search(
    name: Annotated[str, typer.Argument(help="corpus name")],
    query: Annotated[str, typer.Argument(help="what to look for, as a job's model would search")],
    k: Annotated[int, typer.Option("-k", help="how many hits", min=1)] = 5,
) -> None:
    """The hits a `passages_search` for QUERY would get: document, page, heading path, score. A
    hybrid corpus is searched with its recorded embedder, resolved from this machine's settings as a
    worker resolves it; when it cannot be served here, one line says why (exit 1)."""
    from capabilities.corpus import NotACorpusError
    from worker.interfaces.search import CorpusSearch, SearchUnavailable
    from worker.jobs.composition import CompositionError

    async def run() -> list[SearchHit]:
        return await CorpusSearch.from_settings(get_settings()).search(name, query, limit=k)

    try:
        hits = asyncio.run(run())
    except (CompositionError, NotACorpusError) as exc:
        _fail(str(exc), 2)
    except SearchUnavailable as exc:
        _fail(str(exc), 1)
    if not hits:
        console.print(f"no hits for {escape(repr(query))} in {escape(name)}", highlight=False, soft_wrap=True)
        return
    table = Table(title=escape(f"{name}: {query}"))
    for column in ("#", "score", "document", "page", "section", "chunk", "text"):
        table.add_column(column, justify="right" if column in ("#", "score", "page") else "left",
                         overflow="fold" if column == "chunk" else "ellipsis")
    for rank, hit in enumerate(hits, start=1):
        snippet = " ".join(hit.text.split())[:SNIPPET_CHARS]
        table.add_row(str(rank), f"{hit.score:.3g}", escape(hit.document), ", ".join(map(str, hit.pages)),
                      escape(" › ".join(hit.heading_path)), escape(hit.chunk_id), escape(snippet))
    console.print(table)


def register(cli: typer.Typer) -> None:
    cli.command()(ingest)
    cli.add_typer(corpus_app, name="corpus")
