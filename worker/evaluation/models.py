"""The typed shape of evaluation results: one run's V5 metrics, their means over repeats (V8), the report.

The report, its charts, `report.json` and the CLI read these attributes, so a metric renamed here is
a type error wherever it is shown rather than a silently empty cell. `Numbers` is declared once and
used twice: with integer counts for one run, and with float means for an arm (`ArmMeans`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import fmean
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel

from capabilities import CitationStatus
from worker.jobs.models import CitedChunk, JobError

C = TypeVar("C", int, float)  # a count: an int in one run, a float as a mean over runs
Mixed = Literal["mixed"]  # runs (or jobs) of one arm disagreed on a value that should be one
Outcome = Literal["right", "partial", "wrong", "unlabelled"]


class StatusCounts(BaseModel, Generic[C]):
    grounded: C
    ungrounded: C
    missing: C


class StatusSplits(BaseModel, Generic[C]):
    """Citation status over all questions, and split by the V3 label."""

    all: StatusCounts[C]
    answerable: StatusCounts[C]
    unanswerable: StatusCounts[C]


class RefusalScores(BaseModel, Generic[C]):
    """Refusal as a prediction of "unanswerable"; a ratio with nothing to divide by is None."""

    tp: C
    fp: C
    fn: C
    tn: C
    precision: float | None
    recall: float | None
    f1: float | None


class Numbers(BaseModel, Generic[C]):
    """V5's numbers for one arm: what one run measured, or (as `ArmMeans`) their mean over runs."""

    questions: C
    answerable: C
    unanswerable: C
    unlabelled: C
    failed: C
    status: StatusSplits[C]
    ungrounded_declarations: C
    ungrounded_declarations_unanswerable: C
    ungrounded_declarations_answerable: C
    grounded_unanswerable: C
    answerable_answered: C
    answerable_grounded: C
    redirects: C
    violations: C
    undeclared: C
    invented: C | None  # None: nobody read the answers (V4)
    invented_checked: C
    mean_n_requests: float | None
    redirect_requests: C
    refusal: RefusalScores[C]


class QuestionRow(BaseModel):
    """One evaluated answer: V4's per-question fields and what the report shows beside them."""

    job_id: str
    custom_id: str
    question: str
    answerable: bool | None
    status: CitationStatus
    redirects: int
    violation: bool
    refusal: bool
    correct: bool | None
    invented: bool | None  # None: not reviewed
    n_requests: int
    answer: str
    reference_answer: str | None
    judge_reason: str
    declared_refs: list[dict[str, str]] = []
    cited: list[CitedChunk] = []

    @property
    def answered(self) -> bool:
        """V5's "answered": not a refusal, and judged correct."""
        return not self.refusal and self.correct is True

    @property
    def outcome(self) -> Outcome:
        return outcome(self.status, self.answerable)


def outcome(status: CitationStatus, answerable: bool | None) -> Outcome:
    """V9: what a citation status means for the question's label, which is how the report colours it.
    Grounded is right only where the corpus holds the answer; on an unanswerable question it claims
    evidence that cannot exist, and the honest answer is an ungrounded declaration. Undeclared
    (missing) is wrong everywhere. Without a label, only missing can be judged."""
    if status == "missing":
        return "wrong"
    if answerable is None:
        return "unlabelled"
    if answerable:
        return "right" if status == "grounded" else "partial"
    return "right" if status == "ungrounded" else "wrong"


class FailedJob(BaseModel):
    job_id: str
    custom_id: str
    error: JobError | None


class RunMetrics(Numbers[int]):
    """V5 for one run of one arm (`scoring.compute`). Failed jobs are in `failed_jobs` and no count."""

    judge: str
    model: str | Mixed | None
    policy_registered: bool | Mixed | None
    failed_jobs: list[FailedJob]
    rows: list[QuestionRow]


class ArmMeans(Numbers[float]):
    """V8: each number's mean over an arm's runs; None where some run did not measure it."""

    @classmethod
    def over(cls, runs: Sequence[RunMetrics]) -> ArmMeans:
        if not runs:
            raise ValueError("a mean over runs needs at least one run")
        numbers = [run.model_dump(include=set(Numbers.model_fields)) for run in runs]
        return cls.model_validate(_mean_tree(numbers))


def _mean_tree(values: Sequence[Any]) -> Any:
    """The mean of equally shaped values: numbers averaged, mappings field by field."""
    first = values[0]
    if isinstance(first, Mapping):
        return {key: _mean_tree([v[key] for v in values]) for key in first}
    if any(v is None for v in values):
        return None
    return fmean(values)


class ArmReport(BaseModel):
    """One arm: a run per batch (V8 asks for repeats), and the means the table shows."""

    name: str
    batches: list[str]
    model: str | Mixed | None
    policy_registered: bool | Mixed | None
    runs: list[RunMetrics]
    mean: ArmMeans


class TableRow(BaseModel):
    """One metric of the seed-style table (V7), formatted: a cell per arm and a difference per other arm."""

    metric: str
    label: str
    values: dict[str, str]  # arm name -> cell
    differences: dict[str, str]  # "ARM − BASELINE" -> difference


class QuestionEntry(BaseModel):
    """One question, with every arm's answer per run (None: failed or absent in that run)."""

    custom_id: str
    question: str
    answerable: bool | None
    reference_answer: str | None
    arms: dict[str, list[QuestionRow | None]]


class Report(BaseModel):
    """What `report.json` holds and `report.html` shows."""

    generated_at: str
    judge: str
    arms: list[ArmReport]
    table: list[TableRow]
    questions: list[QuestionEntry]
    notes: list[str]

    @property
    def difference_names(self) -> list[str]:
        """The difference columns, each arm against the first (the baseline)."""
        return [difference_name(arm, self.arms[0]) for arm in self.arms[1:]]

    @property
    def failures(self) -> list[tuple[str, FailedJob]]:
        """Every failed job of every run, with its arm's name."""
        return [(arm.name, job) for arm in self.arms for run in arm.runs for job in run.failed_jobs]


def difference_name(arm: ArmReport, baseline: ArmReport) -> str:
    return f"{arm.name} − {baseline.name}"
