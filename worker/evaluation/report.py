"""The evaluation report: arms side by side (report.json), rendered as one self-contained HTML page.

The page holds the seed-style table (V7's metrics, one column per arm, with the difference), the
charts, a per-question table (V8 asks for one) and every answer with its citations, so a reviewer
can read each answer where its numbers come from, offline. The page is a Jinja2 template with
autoescaping on: answers, questions, titles and arm names come from models, corpora and callers,
so every value is escaped unless the template says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from typing import Any, TypeVar

import jinja2

from capabilities import TagSigner
from worker.jobs.models import JobResult

from .charts import behaviour_chart, status_chart
from .judges import Judgements, rule_judgements
from .models import (
    ArmMeans,
    ArmReport,
    Mixed,
    Numbers,
    QuestionEntry,
    QuestionRow,
    Report,
    TableRow,
    difference_name,
)
from .scoring import Reviews, compute

Pick = Callable[[Numbers[Any]], float | None]  # one number, from a run's metrics or from an arm's means
H = TypeVar("H", bound=Hashable)


@dataclass(frozen=True)
class Metric:
    key: str  # the row's name in report.json's table
    label: str
    pick: Pick
    out_of: Pick | None = None  # shown as value/denominator
    needs_policy: bool = False  # meaningless for an arm without the policy
    needs_review: bool = False  # 0 only where someone read the answers (V4)
    decimals: int = 0


# V5 in V7's order: what the reference measurement reported, then the operational numbers.
METRICS: tuple[Metric, ...] = (
    Metric("ungrounded_declarations", "Explicit ungrounded declarations", lambda n: n.ungrounded_declarations),
    Metric("ungrounded_declarations_unanswerable", "… on unanswerable questions",
           lambda n: n.ungrounded_declarations_unanswerable, out_of=lambda n: n.unanswerable),
    Metric("ungrounded_declarations_answerable", "… on answerable questions",
           lambda n: n.ungrounded_declarations_answerable, out_of=lambda n: n.answerable),
    Metric("grounded_unanswerable", "Grounded answers to unanswerable questions",
           lambda n: n.grounded_unanswerable, out_of=lambda n: n.unanswerable),
    Metric("answerable_answered", "Answerable questions answered",
           lambda n: n.answerable_answered, out_of=lambda n: n.answerable),
    Metric("answerable_grounded", "Answerable questions grounded",
           lambda n: n.answerable_grounded, out_of=lambda n: n.answerable),
    Metric("redirects", "Redirects fired", lambda n: n.redirects),
    Metric("violations", "Violations", lambda n: n.violations, needs_policy=True),
    Metric("undeclared", "Undeclared (status missing)", lambda n: n.undeclared),
    Metric("invented", "Invented grounding", lambda n: n.invented, needs_review=True),
    Metric("mean_n_requests", "Mean model requests per question", lambda n: n.mean_n_requests, decimals=2),
    Metric("redirect_requests", "Extra requests from redirects", lambda n: n.redirect_requests),
    Metric("refusal.precision", "Refusal precision (vs. unanswerable)", lambda n: n.refusal.precision, decimals=2),
    Metric("refusal.recall", "Refusal recall", lambda n: n.refusal.recall, decimals=2),
    Metric("refusal.f1", "Refusal F1", lambda n: n.refusal.f1, decimals=2),
    Metric("questions", "Questions evaluated", lambda n: n.questions),
    Metric("failed", "Failed jobs (excluded from every count)", lambda n: n.failed),
)


@dataclass(frozen=True)
class ArmRuns:
    """One arm of an experiment: a batch per repeat, the same questions in the same order (V2)."""

    name: str
    runs: Sequence[Sequence[JobResult]]
    batch_ids: Sequence[str] = field(default_factory=tuple)


def build_report(
    arms: Sequence[ArmRuns],
    *,
    signer: TagSigner,
    judgements: Judgements | None = None,
    reviews: Reviews | None = None,
    notes: Sequence[str] = (),
) -> Report:
    if not arms:
        raise ValueError("a report needs at least one arm")
    everything = [r for arm in arms for run in arm.runs for r in run]
    judgements = judgements or rule_judgements(everything)
    arm_reports = []
    for arm in arms:
        if not arm.runs:
            raise ValueError(f"arm {arm.name!r} has no runs; give it at least one batch")
        runs = [compute(run, signer=signer, judgements=judgements, reviews=reviews) for run in arm.runs]
        arm_reports.append(ArmReport(
            name=arm.name,
            batches=list(arm.batch_ids),
            model=_same([run.model for run in runs]),
            policy_registered=_same([run.policy_registered for run in runs]),
            runs=runs,
            mean=ArmMeans.over(runs),
        ))
    return Report(
        generated_at=datetime.now(UTC).isoformat(timespec="seconds"),
        judge=judgements.judge,
        arms=arm_reports,
        table=_table(arm_reports),
        questions=_questions(arm_reports),
        notes=list(notes),
    )


def _same(values: Sequence[H]) -> H | Mixed:
    distinct = {str(v): v for v in values}
    return next(iter(distinct.values())) if len(distinct) == 1 else "mixed"


def fmt(value: float | None, decimals: int = 0) -> str:
    """A number as the table shows it: counts as integers, means and ratios with two decimals."""
    if value is None:
        return "–"
    if isinstance(value, float) and (decimals or not value.is_integer()):
        return f"{value:.{max(decimals, 2)}f}"
    return str(int(value))


def _cell(metric: Metric, arm: ArmReport) -> str:
    """The mean, then the per-run values when the arm ran more than once (V8)."""
    if metric.needs_policy and arm.policy_registered is False:
        return "n/a (no policy)"
    if metric.needs_review:
        return _invented_cell(arm)
    mean = metric.pick(arm.mean)
    text = fmt(mean, metric.decimals)
    if metric.out_of is not None and mean is not None:
        text += f"/{fmt(metric.out_of(arm.mean))}"
    if len(arm.runs) > 1:
        text += " (" + ", ".join(fmt(metric.pick(r), metric.decimals) for r in arm.runs) + ")"
    return text


def _invented_cell(arm: ArmReport) -> str:
    """V4/V5: invented grounding is 0 only where someone read the answers."""
    parts = []
    for run in arm.runs:
        if run.invented is None:
            parts.append("not checked")
        elif run.invented_checked < run.questions:
            parts.append(f"{run.invented} ({run.invented_checked}/{run.questions} checked)")
        else:
            parts.append(str(run.invented))
    distinct = list(dict.fromkeys(parts))
    return distinct[0] if len(distinct) == 1 else ", ".join(parts)


def _difference(metric: Metric, first: ArmReport, other: ArmReport) -> str:
    if metric.needs_policy and False in (first.policy_registered, other.policy_registered):
        return "n/a"
    if metric.needs_review and any(r.invented is None for r in (*first.runs, *other.runs)):
        return "n/a"
    a, b = metric.pick(first.mean), metric.pick(other.mean)
    if a is None or b is None:
        return "–"
    delta = b - a
    text = fmt(abs(delta), metric.decimals)
    return "0" if delta == 0 else ("+" if delta > 0 else "−") + text


def _table(arms: Sequence[ArmReport]) -> list[TableRow]:
    return [
        TableRow(
            metric=m.key,
            label=m.label,
            values={arm.name: _cell(m, arm) for arm in arms},
            differences={difference_name(arm, arms[0]): _difference(m, arms[0], arm) for arm in arms[1:]},
        )
        for m in METRICS
    ]


def _questions(arms: Sequence[ArmReport]) -> list[QuestionEntry]:
    """One entry per question, in the first arm's order, with every arm's answer per run."""
    order: dict[str, QuestionEntry] = {}
    for arm in arms:
        for run in arm.runs:
            for row in run.rows:
                order.setdefault(row.custom_id, QuestionEntry(
                    custom_id=row.custom_id,
                    question=row.question,
                    answerable=row.answerable,
                    reference_answer=row.reference_answer,
                    arms={a.name: [None] * len(a.runs) for a in arms},
                ))
    for arm in arms:
        for index, run in enumerate(arm.runs):
            for row in run.rows:
                order[row.custom_id].arms[arm.name][index] = row
    return list(order.values())


# --- HTML ---------------------------------------------------------------------------------------


def answer_anchor(qi: int, ai: int, ri: int) -> str:
    return f"a-{qi}-{ai}-{ri}"


def citation_anchor(qi: int, ai: int, ri: int, ci: int) -> str:
    return f"c-{qi}-{ai}-{ri}-{ci}"


def label(answerable: bool | None) -> str:
    return {True: "answerable", False: "unanswerable", None: "unlabelled"}[answerable]


def marks(row: QuestionRow) -> list[str]:
    """The badges beside an answer's status: what the judge, the policy and a reviewer said of it."""
    found = []
    if row.refusal:
        found.append("refusal")
    if row.correct is True:
        found.append("correct")
    elif row.correct is False:
        found.append("incorrect")
    if row.redirects:
        found.append(f"redirect×{row.redirects}")
    if row.violation:
        found.append("violation")
    if row.invented:
        found.append("invented")
    return found


@cache
def _templates() -> jinja2.Environment:
    """Autoescaping for every template (HTML and SVG alike); None renders as nothing, as a blank cell."""
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("worker.evaluation", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=lambda value: "" if value is None else value,
    )
    environment.globals.update(answer_anchor=answer_anchor, citation_anchor=citation_anchor, label=label,
                               marks=marks, fmt=fmt)
    return environment


def render_html(report: Report) -> str:
    return _templates().get_template("report.html.j2").render(
        report=report, charts=[status_chart(report.arms), behaviour_chart(report.arms)]
    )
