"""`grounded`: ingest and inspect corpora, submit and follow batches, run workers, Flower and the API, and the demo.

Batch commands talk to Redis directly (GROUNDED_REDIS_URL), as an operator would, and submit as
the tenant GROUNDED_CLI_TENANT (`local`) unless given `--tenant`; the API shows those batches to
tokens of that tenant. Remote producers use the HTTP API or `worker.client`. Every submission goes
through `parse_batch`.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from worker.settings import get_settings

from .chat import register as register_chat
from .corpus import register as register_corpus
from .experiment import register as register_experiment
from .mcp import register as register_mcp
from .views import line, plain

if TYPE_CHECKING:
    from worker.producer import Producer
    from worker.store.results import ResultsStore

cli = typer.Typer(name="grounded", help=__doc__, no_args_is_help=True, add_completion=False)
console = Console()
err = Console(stderr=True)
register_corpus(cli)

TenantOption = Annotated[
    str | None,
    typer.Option("--tenant", help="the tenant to act as (default GROUNDED_CLI_TENANT, `local`); the API shows "
                 "its batches and conversations to tokens mapped to it in GROUNDED_API_TOKENS"),
]


class Format(str, Enum):
    auto = "auto"
    table = "table"
    jsonl = "jsonl"


def _producer() -> Producer:
    """Imported lazily, so `grounded --help` stays quick."""
    from worker.producer import Producer

    return Producer(get_settings())


def _fail(message: str, code: int = 1) -> NoReturn:
    """One red line on stderr; the message may quote user or corpus text, so it is never markup."""
    err.print(plain(message, "red"), soft_wrap=True)
    raise typer.Exit(code)


def _require_batch(store: ResultsStore, batch_id: str) -> None:
    if store.load_batch(batch_id) is None:
        _fail(f"no batch {batch_id!r}")


def _follow(producer: Producer, batch_id: str, timeout: float) -> None:
    """A progress bar until the batch finishes, then its counts and its results."""
    from worker.polling import StillWaiting

    from .following import follow_batch
    from .views import progress_view, results_summary, results_table

    try:
        progress = follow_batch(producer.store, batch_id, console, timeout=timeout)
    except StillWaiting as exc:
        err.print(f"[yellow]still {exc.last.state} after {timeout:g} s[/]")
        raise typer.Exit(3) from None
    results = list(producer.store.iter_results(batch_id))
    console.print(progress_view(progress))
    console.print(results_table(results))
    console.print(results_summary(results))


@cli.command()
def submit(
    file: Annotated[Path, typer.Argument(help="JSONL, one job a line", exists=True, dir_okay=False)],
    config: Annotated[Path, typer.Option("--config", help="job config (YAML or JSON)", exists=True, dir_okay=False)],
    wait: Annotated[bool, typer.Option("--wait", help="show progress until the batch finishes")] = False,
    arm: Annotated[str | None, typer.Option(help="label for evaluation arms")] = None,
    tenant: TenantOption = None,
    timeout: Annotated[float, typer.Option(help="seconds --wait waits")] = 3600.0,
) -> None:
    """Validate every line, then store and enqueue the batch (nothing is enqueued if a line is bad).
    Prints the batch id and each conversation's id; with --wait, the results as a table."""
    from .views import conversation_ids, rejected_view

    producer = _producer()
    tenant = tenant or producer.settings.cli_tenant
    report = producer.validate(file.read_text().splitlines(), config.read_text(), tenant=tenant)
    if not report.ok:
        err.print(rejected_view(report.errors))
        raise typer.Exit(1)
    batch = producer.submit(report, tenant=tenant, arm=arm)
    console.print(line("batch ", (batch.id, "bold"), f": {batch.total} jobs queued (tenant ", (tenant, "bold"), ")"),
                  soft_wrap=True)
    job_ids = producer.store.job_ids(batch.id)  # in line order, as report.jobs
    conversations = [(spec.custom_id, job_id) for spec, job_id in zip(report.jobs, job_ids, strict=True)
                     if spec.kind == "conversation"]
    for text in conversation_ids(conversations):
        console.print(text, soft_wrap=True)
    if conversations:
        console.print('follow up with: grounded ask --conversation ID "next question"', style="dim", soft_wrap=True)
    if wait:
        _follow(producer, batch.id, timeout)


@cli.command()
def status(batch_id: str) -> None:
    """Counts, state and tenant of a batch."""
    from .views import progress_view

    progress = _producer().store.progress(batch_id)
    if progress is None:
        _fail(f"no batch {batch_id!r}")
    console.print(progress_view(progress))


@cli.command()
def results(
    batch_id: str,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write JSONL to this file")] = None,
    format: Annotated[
        Format,
        typer.Option("--format", case_sensitive=False,
                     help="table: one row per answer; jsonl: one JobResult a line, everything stored (wire "
                     "transcripts included); auto: a table on a terminal, JSONL into a pipe or a file"),
    ] = Format.auto,
) -> None:
    """Finished results in submission order (partial while the batch runs): a table on a terminal,
    JSONL when piped, redirected or written with -o, or as --format says."""
    from .views import results_summary, results_table

    store = _producer().store
    _require_batch(store, batch_id)
    as_table = format is Format.table or (format is Format.auto and output is None and sys.stdout.isatty())
    if as_table and output is None:
        found = list(store.iter_results(batch_id))
        console.print(results_table(found, title=f"Results of {batch_id}"))
        console.print(results_summary(found))
        console.print(f"everything stored (JSONL): grounded results {batch_id} --format jsonl", style="dim",
                      soft_wrap=True)
        return
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
        console.print(plain(f"{count} results written to {output}"))


@cli.command()
def cancel(batch_id: str) -> None:
    """Skip the batch's queued jobs; running jobs finish and are recorded."""
    producer = _producer()
    _require_batch(producer.store, batch_id)
    producer.cancel(batch_id)
    console.print(f"batch {batch_id}: cancel requested", soft_wrap=True)


@cli.command()
def delete(batch_id: str, tenant: TenantOption = None) -> None:
    """Remove the batch and everything under it from Redis now (its jobs, results, events and the
    conversations it started); a running batch stops. Otherwise a batch expires after
    GROUNDED_RETENTION_DAYS."""
    from worker.producer import NotFound

    producer = _producer()
    try:
        removed = producer.delete(batch_id, tenant or producer.settings.cli_tenant)
    except NotFound as exc:
        _fail(f"{exc} for tenant {tenant or producer.settings.cli_tenant!r}")
    console.print(f"batch {batch_id}: deleted ({removed} keys)", soft_wrap=True)


@cli.command()
def ask(
    question: Annotated[str, typer.Argument(help="the user's next question")],
    conversation: Annotated[str, typer.Option("--conversation", help="the conversation id (its first job's id)")],
    config: Annotated[
        Path | None, typer.Option(help="job config; default: the conversation's own", exists=True, dir_okay=False)
    ] = None,
    tenant: TenantOption = None,
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
        _fail(str(exc))
    except JobLineError as exc:
        _fail(exc.problem)
    console.print(line("job ", (job.id, "bold"), " queued on conversation ", (conversation, "bold")), soft_wrap=True)
    if not wait:
        return
    from .views import CITATION_STYLES, cited_label

    result = producer.store.wait_result(job.id, job.batch_id, timeout)
    if result is None:
        err.print(f"[yellow]no answer after {timeout:g} s; `grounded results {job.batch_id}` shows it later[/]")
        raise typer.Exit(3)
    if result.status == "failed" or not result.turns:
        _fail(f"failed: {result.error.type}: {result.error.message}" if result.error else "failed: no answer")
    turn = result.turns[-1]
    console.print(plain(turn.answer))
    citations = f": {len(turn.cited)} citation(s)" if turn.cited else ": nothing cited"
    console.print(Text.assemble((turn.citation_status, f"bold {CITATION_STYLES[turn.citation_status]}"), citations))
    for cited in turn.cited:
        console.print(plain(f"  {cited_label(cited)}"), soft_wrap=True)


@cli.command()
def worker(
    concurrency: Annotated[
        int | None, typer.Option("-c", "--concurrency", help="jobs at once (default GROUNDED_CONCURRENCY)")
    ] = None,
    pool: Annotated[str | None, typer.Option(help="threads (default) or prefork")] = None,
    loglevel: Annotated[str, typer.Option("-l", "--loglevel")] = "info",
    processes: Annotated[
        int | None, typer.Option("-p", "--processes", min=1,
                                 help="worker processes on this host (default GROUNDED_PROCESSES, else one per core)")
    ] = None,
    name: Annotated[
        str | None, typer.Option("-n", "--name", help="node name, NAME@HOST (default GROUNDED_WORKER_NAME, else "
                                 "grounded-PID@HOST); with several processes, each is NAME-i@HOST")
    ] = None,
) -> None:
    """Run Celery workers for the job queue: one process per core by default, each with its own
    event loop and threads pool (many LLM-bound jobs per process), stopped together.

    SIGTERM stops them gracefully: no new jobs, running ones get GROUNDED_SOFT_SHUTDOWN_S to finish,
    the rest go back to the queue (H15)."""
    from worker.settings import MissingTagKeys

    settings = get_settings()
    try:
        settings.signer()
    except MissingTagKeys as exc:
        _fail(str(exc), 2)
    from worker.tasks.supervisor import Supervisor, available_cores, child_names, preload
    from worker.tasks.worker_process import default_node_name, worker_argv

    node = name or settings.worker_name or default_node_name()
    count = processes or settings.processes or available_cores()

    def run_worker(as_node: str) -> int:
        from worker.app import app as celery_app

        celery_app.worker_main(worker_argv(name=as_node, pool=pool or settings.pool,
                                           concurrency=concurrency or settings.concurrency, loglevel=loglevel))
        return 0

    if count == 1:
        raise typer.Exit(run_worker(node))
    if not hasattr(os, "fork"):
        _fail("several worker processes are forked from one (Linux, macOS): here, start one `grounded worker "
              "--processes 1` per process", 2)
    from worker.tasks.logs import configure_logging

    configure_logging(loglevel)  # the supervisor's lines in the workers' format
    preload()
    raise typer.Exit(Supervisor(child_names(node, count), run_worker).run())


@cli.command()
def flower(
    address: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port")] = 5555,
    purge_offline_workers: Annotated[
        int | None, typer.Option(help="seconds after which stopped workers leave the list (autoscaled workers)")
    ] = None,
) -> None:
    """Flower on the job queue: its task list shows each job's batch and custom id, its outcome (the
    citation status, or the error of a failed job). Needs FLOWER_BASIC_AUTH=user:password, which
    Flower reads from the environment (so the password is not on the command line)."""
    from worker.tasks.celery_app import create_flower_app
    from worker.tasks.events import FLOWER_TASK_COLUMNS

    settings = get_settings()
    if settings.flower_basic_auth is None or not settings.flower_basic_auth.get_secret_value():
        _fail("FLOWER_BASIC_AUTH is not set: give Flower user:password (comma-separated for several users); "
              "without it Flower's UI and API would be open to anyone who reaches the port", 2)
    argv = ["flower", f"--address={address}", f"--port={port}", f"--tasks_columns={FLOWER_TASK_COLUMNS}"]
    if purge_offline_workers is not None:
        argv.append(f"--purge_offline_workers={purge_offline_workers}")
    create_flower_app(settings).start(argv)


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
        _fail(str(exc), 2)
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
    """The `grounded` console script. A command that cannot reach Redis says so in one line naming
    the URL, and exits 1, whichever command it was."""
    try:
        cli()
    except Exception as exc:
        from worker.redaction import url_without_password
        from worker.store.outages import REDIS_UNAVAILABLE

        if not isinstance(exc, REDIS_UNAVAILABLE):
            raise
        reason = " ".join(str(exc).split()) or type(exc).__name__
        url = url_without_password(get_settings().redis_url)
        typer.echo(f"cannot reach Redis at {url} (GROUNDED_REDIS_URL): {reason}", err=True)
        sys.exit(1)
