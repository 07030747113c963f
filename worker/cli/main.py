"""`grounded`: ingest corpora, submit and follow batches, run workers and the API, and the demo.

Batch commands talk to Redis directly (GROUNDED_REDIS_URL), as an operator would; remote
producers use the HTTP API or `worker.client`. Every submission goes through `parse_batch`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from worker.settings import get_settings

from .chat import register as register_chat
from .experiment import register as register_experiment
from .mcp import register as register_mcp

if TYPE_CHECKING:
    from worker.producer import Producer
    from worker.store.results import BatchProgress

cli = typer.Typer(name="grounded", help=__doc__, no_args_is_help=True, add_completion=False)
console = Console()
err = Console(stderr=True)


def _producer() -> Producer:
    """Imported lazily, so `grounded --help` stays quick."""
    from worker.producer import Producer

    return Producer(get_settings())


def _progress_table(progress: BatchProgress) -> Table:
    table = Table(title=f"Batch {progress.batch_id}", show_header=False)
    data = progress.as_dict()
    table.add_row("state", data["state"])
    for name, value in data["counts"].items():
        table.add_row(name, str(value))
    table.add_row("arm", str(progress.arm))
    return table


@cli.command()
def ingest(
    paths: Annotated[list[Path], typer.Argument(help="files or folders (Markdown, text, HTML)", exists=True)],
    corpus: Annotated[str, typer.Option("--corpus", help="the name jobs use for this corpus")],
    embedder: Annotated[
        str | None,
        typer.Option("--embedder", help="embedding model for hybrid search (openai:text-embedding-3-small, "
                     "openai-compatible:NAME, sentence-transformers:NAME, ...); `none` makes the corpus BM25-only; "
                     "default: the corpus's own"),
    ] = None,
) -> None:
    """Ingest documents into DATA_DIR/corpora/NAME.sqlite (created if missing)."""
    from capabilities.corpus import ingest as ingest_files
    from worker.jobs.composition import CompositionError, check_corpus_name

    from .embedding import IngestFailure, chosen_embedder, embedding_lines, progress_display

    settings = get_settings()
    try:
        check_corpus_name(corpus)
    except CompositionError as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    settings.corpora_dir.mkdir(parents=True, exist_ok=True)
    target = settings.corpora_dir / f"{corpus}.sqlite"
    try:
        chosen = chosen_embedder(target, embedder, settings)
        with progress_display(console, chosen) as progress:
            report = ingest_files(target, paths, embedder=chosen, progress=progress)
    except IngestFailure.causes as exc:
        err.print(f"[red]{IngestFailure.describe(exc)}[/]")
        raise typer.Exit(1) from None
    console.print(f"{target}: {len(report.added)} added, {len(report.replaced)} replaced, "
                  f"{len(report.skipped_unchanged)} unchanged")
    for line in embedding_lines(report.embedding):
        console.print(line)
    for path, problem in report.errors:
        err.print(f"[yellow]{path}[/]: {problem}")


def _follow(producer: Producer, batch_id: str, timeout: float) -> None:
    from worker.polling import StillWaiting

    from .following import follow_batch

    try:
        progress = follow_batch(producer.store, batch_id, console, timeout=timeout)
    except StillWaiting as exc:
        err.print(f"[yellow]still {exc.last.state} after {timeout:g} s[/]")
        raise typer.Exit(3) from None
    console.print(_progress_table(progress))


@cli.command()
def submit(
    file: Annotated[Path, typer.Argument(help="JSONL, one job a line", exists=True, dir_okay=False)],
    config: Annotated[Path, typer.Option("--config", help="job config (YAML or JSON)", exists=True, dir_okay=False)],
    wait: Annotated[bool, typer.Option("--wait", help="show progress until the batch finishes")] = False,
    arm: Annotated[str | None, typer.Option(help="label for evaluation arms")] = None,
    tenant: Annotated[str | None, typer.Option(help="tenant to submit as (default GROUNDED_CLI_TENANT)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds --wait waits")] = 3600.0,
) -> None:
    """Validate every line, then store and enqueue the batch (nothing is enqueued if a line is bad)."""
    producer = _producer()
    report = producer.validate(file.read_text().splitlines(), config.read_text())
    if not report.ok:
        table = Table(title="Batch rejected: nothing was enqueued", show_lines=False)
        table.add_column("line", justify="right")
        table.add_column("problem")
        for error in report.errors:
            table.add_row("config" if error.line_no == 0 else str(error.line_no), error.problem)
        err.print(table)
        raise typer.Exit(1)
    batch = producer.submit(report, tenant=tenant or producer.settings.cli_tenant, arm=arm)
    console.print(f"batch [bold]{batch.id}[/]: {batch.total} jobs queued")
    if wait:
        _follow(producer, batch.id, timeout)


@cli.command()
def status(batch_id: str) -> None:
    """Counts and state of a batch."""
    progress = _producer().store.progress(batch_id)
    if progress is None:
        err.print(f"[red]no batch {batch_id!r}[/]")
        raise typer.Exit(1)
    console.print(_progress_table(progress))


@cli.command()
def results(
    batch_id: str,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write JSONL here, not stdout")] = None,
) -> None:
    """Finished results as JSONL, in submission order (partial while the batch runs)."""
    store = _producer().store
    if store.load_batch(batch_id) is None:
        err.print(f"[red]no batch {batch_id!r}[/]")
        raise typer.Exit(1)
    handle = output.open("wb") if output else sys.stdout.buffer
    count = 0
    try:
        for raw in store.iter_results_raw(batch_id):
            handle.write(raw + b"\n")
            count += 1
    finally:
        if output:
            handle.close()
    if output:
        console.print(f"{count} results written to {output}")


@cli.command()
def cancel(batch_id: str) -> None:
    """Skip the batch's queued jobs; running jobs finish and are recorded."""
    producer = _producer()
    if producer.store.load_batch(batch_id) is None:
        err.print(f"[red]no batch {batch_id!r}[/]")
        raise typer.Exit(1)
    producer.cancel(batch_id)
    console.print(f"batch {batch_id}: cancel requested")


@cli.command()
def ask(
    question: Annotated[str, typer.Argument(help="the user's next question")],
    conversation: Annotated[str, typer.Option("--conversation", help="the conversation id (its first job's id)")],
    config: Annotated[
        Path | None, typer.Option(help="job config; default: the conversation's own", exists=True, dir_okay=False)
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="tenant the conversation belongs to")] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="wait for the answer and print it")] = True,
    timeout: Annotated[float, typer.Option(help="seconds --wait waits")] = 600.0,
) -> None:
    """Add a turn to a stored conversation: it runs with the conversation's history, state and
    capabilities, after any turn already queued for it."""
    from worker.jobs.lines import JobLineError
    from worker.store.conversations import CompositionMismatch, ConversationNotFound

    producer = _producer()
    try:
        job = producer.follow_up(conversation, question, tenant=tenant or producer.settings.cli_tenant,
                                 config=config.read_text() if config else None)
    except (ConversationNotFound, CompositionMismatch) as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from None
    except JobLineError as exc:
        err.print(f"[red]{exc.problem}[/]")
        raise typer.Exit(1) from None
    console.print(f"job [bold]{job.id}[/] queued on conversation {conversation}")
    if not wait:
        return
    deadline = time.monotonic() + timeout
    while (result := producer.store.load_result(job.id)) is None:
        if time.monotonic() > deadline:
            err.print(f"[yellow]no answer after {timeout:g} s; `grounded results {job.batch_id}` shows it later[/]")
            raise typer.Exit(3)
        time.sleep(0.3)
    if result.status == "failed" or not result.turns:
        err.print(f"[red]failed[/]: {result.error.message if result.error else 'no answer'}")
        raise typer.Exit(1)
    turn = result.turns[-1]
    console.print(str(turn.answer))
    console.print(f"[bold]{turn.citation_status}[/] (question {turn.question_identity})")
    for cited in turn.cited:
        console.print(f"  [{cited.chunk_id}] {cited.document_title or cited.document_uri}")


@cli.command()
def worker(
    concurrency: Annotated[
        int | None, typer.Option("-c", "--concurrency", help="jobs at once (default GROUNDED_CONCURRENCY)")
    ] = None,
    pool: Annotated[str | None, typer.Option(help="threads (default) or prefork")] = None,
    loglevel: Annotated[str, typer.Option("-l", "--loglevel")] = "info",
) -> None:
    """Run a Celery worker for the job queue (threads pool: many LLM-bound jobs per process)."""
    from worker.settings import MissingTagKeys

    settings = get_settings()
    try:
        settings.signer()
    except MissingTagKeys as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    from worker.app import app as celery_app
    from worker.store.keys import QUEUE

    celery_app.worker_main([
        "worker", "--pool", pool or settings.pool, "--concurrency", str(concurrency or settings.concurrency),
        "--queues", QUEUE, "--loglevel", loglevel, "--task-events",
    ])


@cli.command()
def api(
    host: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port")] = 8000,
) -> None:
    """Serve the producer HTTP API (needs GROUNDED_API_TOKENS)."""
    import uvicorn

    from worker.api.app import create_api

    try:
        application = create_api(get_settings())
    except RuntimeError as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    uvicorn.run(application, host=host, port=port)


@cli.command()
def demo(
    questions: Annotated[Path | None, typer.Option(help="JSONL of questions")] = None,
    config: Annotated[Path | None, typer.Option(help="job config")] = None,
    corpus: Annotated[Path | None, typer.Option(help="folder of documents to ingest")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="where the results JSONL goes")] = None,
) -> None:
    """Embedded Redis, the sample corpus, a real worker, the offline extractive model: end to end."""
    from .demo import EXAMPLES, default_output, run_demo

    code = run_demo(
        questions=questions or EXAMPLES / "questions.jsonl",
        config=config or EXAMPLES / "job.yaml",
        corpus_dir=corpus or EXAMPLES / "corpus",
        output=output or default_output(),
        console=console,
    )
    raise typer.Exit(code)


register_experiment(cli)
register_mcp(cli)
register_chat(cli)


def main() -> None:
    """The `grounded` console script."""
    cli()
