"""`grounded experiment` and `grounded compare`: thin shells over `worker.experiment`.

Kept apart from the logic so that registering them on `grounded` costs nothing at start-up: the
evaluation, templating and Celery imports happen only when a command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from worker.evaluation.models import Report

JudgeOption = Annotated[
    Path | None,
    typer.Option("--judge", help="a config naming the judge model (agent.model, optional endpoint); "
                 "without it a rule-based judge decides refusal and correctness, and the report says so"),
]
ReviewOption = Annotated[
    Path | None,
    typer.Option("--review", help="JSONL of {job_id, invented: 0|1} from reading the answers (V4); "
                 "without it invented grounding is reported as not checked"),
]


def _fail(exc: Exception) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(2)


def _finish(report: Report, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from worker.evaluation.experiment import write_report

    json_path, html_path = write_report(report, out)
    names = [arm.name for arm in report.arms]
    diffs = report.difference_names
    table = Table(title="Evaluation")
    table.add_column("metric")
    for column in [*names, *diffs]:
        table.add_column(column, justify="right")
    for row in report.table:
        table.add_row(row.label, *(row.values[n] for n in names), *(row.differences[d] for d in diffs))
    console = Console()
    console.print(table)
    console.print(f"judge: {report.judge}")
    for note in report.notes:
        console.print(f"[yellow]note:[/] {note}")
    console.print(f"wrote {html_path} and {json_path}")


def experiment(
    questions: Annotated[Path, typer.Argument(help="JSONL, one question job a line, labelled in metadata", exists=True)],
    arm: Annotated[list[str], typer.Option("--arm", help="NAME=CONFIG.yaml, once per arm, baseline first")],
    repeat: Annotated[int, typer.Option(min=1, help="runs per arm (V8 asks for at least 3)")] = 1,
    out: Annotated[Path, typer.Option("-o", "--out", help="where report.html and report.json go")] = Path("experiment"),
    judge: JudgeOption = None,
    review: ReviewOption = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for every batch to finish")] = 3600.0,
    tenant: Annotated[str | None, typer.Option(help="the tenant to submit as (default GROUNDED_CLI_TENANT)")] = None,
) -> None:
    """Run the same questions in each arm (V2), wait with progress, and write report.html + report.json."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from worker.evaluation.experiment import ArmSpec, load_judge, parse_arm, run_experiment
    from worker.evaluation.scoring import load_reviews
    from worker.settings import MissingTagKeys, get_settings

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        specs = [ArmSpec(name, Path(path).read_text()) for name, path in map(parse_arm, arm)]
        with Progress(*columns) as bar:
            tasks: dict[str, Any] = {}

            def submitted(batches: Any) -> None:
                for name, runs in batches.items():
                    for index, batch in enumerate(runs):
                        tasks[batch.id] = bar.add_task(f"{name} run {index + 1} ({batch.id})", total=batch.total)

            def progressed(progress: Any) -> None:
                for p in progress:
                    bar.update(tasks[p.batch_id], completed=p.done + p.cancelled)

            settings = get_settings()
            if tenant is not None:
                settings = settings.model_copy(update={"cli_tenant": tenant})
            report = run_experiment(
                settings, questions, specs, repeat=repeat, timeout_s=timeout, judge_config=load_judge(judge),
                reviews=load_reviews(review) if review is not None else None,
                on_submitted=submitted, on_progress=progressed,
            )
    except (ValueError, OSError, MissingTagKeys) as exc:  # ExperimentError and EvaluationError are ValueErrors
        raise _fail(exc) from None
    _finish(report, out)


def compare(
    batches: Annotated[list[str], typer.Argument(help="[NAME=]BATCH_ID[,BATCH_ID...] per arm, baseline first")],
    out: Annotated[Path, typer.Option("-o", "--out", help="where report.html and report.json go")] = Path("comparison"),
    judge: JudgeOption = None,
    review: ReviewOption = None,
) -> None:
    """Report on batches already run, side by side (differences are against the first)."""
    from worker.evaluation.experiment import load_judge, run_compare
    from worker.evaluation.scoring import load_reviews
    from worker.settings import MissingTagKeys, get_settings

    try:
        report = run_compare(get_settings(), batches, judge_config=load_judge(judge),
                             reviews=load_reviews(review) if review is not None else None)
    except (ValueError, OSError, MissingTagKeys) as exc:
        raise _fail(exc) from None
    _finish(report, out)


def register(cli: typer.Typer) -> None:
    """Adds `experiment` and `compare` to the `grounded` command."""
    cli.command("experiment")(experiment)
    cli.command("compare")(compare)

