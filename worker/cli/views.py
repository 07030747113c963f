"""What the terminal shows of batches and results: Rich renderables built from the stored models.

Rich reads `[...]` in a plain string as markup, so a chunk id printed as `[bcf70dce] Title` would
vanish; every string that came from a user, a corpus or a model is wrapped in `Text` here (never
interpolated into markup), and this module is the one place that builds such output.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from worker.jobs.lines import JobLineError
from worker.jobs.models import CitedChunk, JobResult
from worker.store.results import BatchProgress

CITATION_STYLES = {"grounded": "green", "ungrounded": "yellow", "missing": "red"}
ANSWER_START_CHARS = 160
NONE = "—"


def plain(value: object, style: str = "") -> Text:
    """User-, corpus- or model-derived text, shown exactly as it is."""
    return Text(str(value), style=style)


def line(*parts: str | tuple[str, str]) -> Text:
    """A one-line message from fixed words and plain values: `line("batch ", (batch_id, "bold"))`."""
    return Text.assemble(*parts)


def titled(title: str, table: Table) -> Group:
    """A table under a heading that never wraps: a Table's own title is only as wide as the table,
    so a narrow table broke ids such as `batch_<32 hex>` across lines."""
    return Group(Text(title, style="bold", no_wrap=True, overflow="ignore"), table)


def progress_view(progress: BatchProgress) -> Group:
    table = Table(show_header=False, box=None, padding=(0, 2))
    data = progress.as_dict()
    table.add_row("state", data["state"])
    table.add_row("tenant", plain(progress.tenant))
    for name, value in data["counts"].items():
        table.add_row(name, str(value))
    table.add_row("arm", plain(progress.arm or NONE))
    return titled(f"Batch {progress.batch_id}", table)


def rejected_view(errors: Sequence[JobLineError]) -> Group:
    table = Table(show_lines=False)
    table.add_column("line", justify="right")
    table.add_column("problem")
    for error in errors:
        table.add_row("config" if error.line_no == 0 else str(error.line_no), plain(error.problem))
    return titled("Batch rejected: nothing was enqueued", table)


def answer_start(answer: object, limit: int = ANSWER_START_CHARS) -> str:
    """The answer's first characters on one line; a structured answer as its compact text."""
    text = " ".join(str(answer if answer is not None else "").split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def cited_label(cited: CitedChunk) -> str:
    """`[chunk] document · p. 3`, or `· section` when the document has no pages (Markdown, HTML)."""
    where = ""
    if cited.page_numbers:
        pages = sorted(set(cited.page_numbers))
        where = f" · p. {pages[0]}" if len(pages) == 1 else f" · pp. {pages[0]}-{pages[-1]}"
    elif cited.headings:
        where = f" · {cited.headings[-1]}"
    return f"[{cited.chunk_id[:8]}] {cited.document_title or cited.document_uri or cited.chunk_id}{where}"


def results_table(results: Iterable[JobResult], *, title: str = "Results") -> Group:
    """One row per answered question (a conversation's turns are labelled with their number), and
    one row for a job that failed, with its error."""
    table = Table(show_lines=True, expand=True)
    table.add_column("custom id", ratio=2, overflow="fold")
    table.add_column("question", ratio=3)
    table.add_column("status", no_wrap=True)
    table.add_column("citation", no_wrap=True)
    table.add_column("cited", ratio=3)
    table.add_column("answer", ratio=4)
    for result in results:
        several = result.kind != "question"
        for k, turn in enumerate(result.turns, start=1):
            label = f"{result.custom_id} · turn {k}" if several else result.custom_id
            status = result.status if result.status == "succeeded" else "answered"
            citation = plain(turn.citation_status, CITATION_STYLES[turn.citation_status])
            if turn.redirects:
                citation.append(f"\n{turn.redirects} redirect(s)", style="dim")
            cited = "\n".join(cited_label(c) for c in turn.cited) or NONE
            table.add_row(plain(label), plain(turn.question_text), status, citation, plain(cited),
                          plain(answer_start(turn.answer)))
        if result.status == "failed":
            error = f"{result.error.type}: {result.error.message}" if result.error else "failed"
            label = f"{result.custom_id} · turn {len(result.turns) + 1}" if several else result.custom_id
            table.add_row(plain(label), "", plain("failed", "red"), NONE, NONE, plain(answer_start(error, 300), "red"))
    return titled(title, table)


def conversation_ids(pairs: Iterable[tuple[str, str]]) -> list[Text]:
    """Lines naming each conversation's id (its first job's id), which `grounded ask --conversation`
    and the API's /v1/conversations/{id} take."""
    return [line("conversation ", (custom_id, "bold"), ": ", (conversation_id, "bold"))
            for custom_id, conversation_id in pairs]


def results_summary(results: Sequence[JobResult]) -> Text:
    """Jobs and answered questions counted apart: a conversation is one job that asks several."""
    jobs = {s: sum(r.status == s for r in results) for s in ("succeeded", "failed")}
    statuses = {s: sum(t.citation_status == s for r in results for t in r.turns) for s in CITATION_STYLES}
    answers = sum(statuses.values())
    return Text.assemble(
        f"{len(results)} jobs: {jobs['succeeded']} succeeded, {jobs['failed']} failed. ",
        f"{answers} answers (one per question asked; a conversation asks several): ",
        *[part for s, n in statuses.items() for part in ((f"{n} {s}", CITATION_STYLES[s]), ", ")][:-1],
    )
