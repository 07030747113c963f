"""A batch followed on the terminal: a progress bar until it finishes (`submit --wait`, the demo)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from worker.polling import poll_until
from worker.store.results import BatchProgress, ResultsStore


def follow_batch(store: ResultsStore, batch_id: str, console: Console, *, timeout: float,
                 interval_s: float = 0.3) -> BatchProgress:
    """Returns the finished batch's progress; raises StillWaiting (a TimeoutError) after `timeout`.
    The bar is redrawn every `interval_s`, and the end is seen as it happens."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("answering", total=None)

        def show(progress: BatchProgress) -> None:
            waiting = f"{progress.waiting} waiting on the provider, " if progress.waiting else ""
            bar.update(task, total=progress.total, completed=progress.done + progress.cancelled,
                       description=f"answering ({progress.running} running, {waiting}{progress.failed} failed)")

        return poll_until(lambda: store.progress_of(batch_id), lambda p: p.finished, timeout_s=timeout,
                          interval_s=interval_s, on_each=show, pause=lambda s: store.wait_finished(batch_id, s))
