"""Metrics over stored job results (Part V): V5 computed exactly from what the results store holds (V6).

Nothing is re-run and no live capability is consulted. What the host stored is checked instead: the
citation status is recomputed from the committed ledger, redirects are recounted from the stored
messages with the workers' tag keys, and violations are re-read from the policy state, so a host
bug shows up as an error naming the job rather than as a quietly wrong number.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from statistics import fmean
from typing import Any, TypeVar

from pydantic_ai.messages import ModelMessagesTypeAdapter

from capabilities import (
    POLICY_NAMESPACE,
    CapabilityEvidenceRecord,
    TagSigner,
    citation_status,
    redirects_delivered,
)
from worker.jobs.models import JobResult
from worker.runtime.turns import recorded_violation

from .judges import Judgements, Verdict, answer_text, answerable_label, rule_judgements
from .models import FailedJob, Mixed, QuestionRow, RefusalScores, RunMetrics, StatusCounts, StatusSplits

T = TypeVar("T")
Reviews = Mapping[str, bool]  # job_id -> invented (V4), from a reviewer's file


class EvaluationError(ValueError):
    """Stored results that contradict themselves or cannot be evaluated; names the job."""

    def __init__(self, result: JobResult, problem: str) -> None:
        super().__init__(f"job {result.job_id} ({result.custom_id!r}): {problem}")
        self.job_id, self.problem = result.job_id, problem


def evidence_records(state: Mapping[str, Any]) -> list[CapabilityEvidenceRecord]:
    """Every evidence capability's ledger in the committed state. Each keeps its record under its own
    namespace (L11), so the records are found by shape and need no list of what the job registered."""
    records = []
    for namespace, value in state.items():
        if namespace != POLICY_NAMESPACE and isinstance(value, dict) and isinstance(value.get("evidence"), dict):
            records.append(CapabilityEvidenceRecord.model_validate(value["evidence"]))
    return records


def recount_redirects(new_messages_json: bytes | str, signer: TagSigner, conversation_id: str | None, question: int) -> int:
    """V6: redirects recounted from the stored messages, exactly as the worker counted them."""
    messages = ModelMessagesTypeAdapter.validate_json(new_messages_json)
    return redirects_delivered(messages, signer, conversation_id, question)


def question_row(result: JobResult, *, signer: TagSigner, verdict: Verdict, invented: bool | None) -> QuestionRow:
    """V6 for one succeeded question job: recompute, compare with what was stored, and keep the recount."""
    if result.kind != "question" or len(result.turns) != 1:
        raise EvaluationError(
            result,
            f"a {result.kind} job with {len(result.turns)} turn(s): evaluation reads question jobs (V2), whose "
            "state_after holds the ledger of their one question",
        )
    turn = result.turns[0]
    q = turn.question_identity
    status = citation_status(evidence_records(result.state_after), question=q)
    if status != turn.citation_status:
        raise EvaluationError(
            result, f"stored citation_status {turn.citation_status!r} but state_after gives {status!r} for question {q}"
        )
    redirects = recount_redirects(turn.new_messages_json, signer, result.conversation_id, q)
    if redirects != turn.redirects:
        raise EvaluationError(
            result,
            f"stored redirects={turn.redirects} but the stored messages hold {redirects} verified redirect(s) for "
            f"question {q}; are these the workers' GROUNDED_TAG_KEYS?",
        )
    violation = recorded_violation(result.state_after, q)
    if violation != turn.violation:
        raise EvaluationError(
            result, f"stored violation={turn.violation} but the policy state says {violation} for question {q}"
        )
    reference = result.metadata.get("reference_answer")
    return QuestionRow(
        job_id=result.job_id,
        custom_id=result.custom_id,
        question=turn.question_text,
        answerable=answerable_label(result),
        status=status,
        redirects=redirects,
        violation=violation,
        refusal=verdict.refusal,
        correct=verdict.correct,
        invented=invented,
        n_requests=turn.n_requests,
        answer=answer_text(turn.answer),
        reference_answer=reference if isinstance(reference, str) else None,
        judge_reason=verdict.reason,
        declared_refs=list(turn.declared_refs),
        cited=list(turn.cited),
    )


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def refusal_scores(rows: Sequence[QuestionRow]) -> RefusalScores[int]:
    """Refusal as a prediction of "unanswerable": precision, recall and F1 against the V3 label."""
    labelled = [r for r in rows if r.answerable is not None]
    tp = sum(r.refusal and not r.answerable for r in labelled)
    fp = sum(r.refusal and bool(r.answerable) for r in labelled)
    fn = sum(not r.refusal and not r.answerable for r in labelled)
    tn = sum(not r.refusal and bool(r.answerable) for r in labelled)
    precision, recall = _ratio(tp, tp + fp), _ratio(tp, tp + fn)
    if precision is None or recall is None:
        f1 = None
    else:
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return RefusalScores[int](tp=tp, fp=fp, fn=fn, tn=tn, precision=precision, recall=recall, f1=f1)


def _status_counts(rows: Iterable[QuestionRow]) -> StatusCounts[int]:
    statuses = [r.status for r in rows]
    return StatusCounts[int](grounded=statuses.count("grounded"), ungrounded=statuses.count("ungrounded"),
                             missing=statuses.count("missing"))


def _one_or_mixed(values: Iterable[T]) -> T | Mixed | None:
    distinct = sorted(set(values), key=str)
    return distinct[0] if len(distinct) == 1 else ("mixed" if distinct else None)


def compute(
    arm_results: Sequence[JobResult],
    *,
    signer: TagSigner,
    judgements: Judgements | None = None,
    reviews: Reviews | None = None,
) -> RunMetrics:
    """V5 for one run of one arm. Failed jobs are left out of every count and reported as `failed`;
    without `judgements` the rule-based judge decides refusal and correctness, and says so."""
    judgements = judgements or rule_judgements(arm_results)
    reviews = reviews or {}
    failed = [r for r in arm_results if r.status == "failed"]
    rows: list[QuestionRow] = []
    for result in arm_results:
        if result.status != "succeeded":
            continue
        verdict = judgements.verdicts.get(result.job_id)
        if verdict is None:
            raise EvaluationError(result, f"no verdict from {judgements.judge!r} for this answer")
        rows.append(question_row(result, signer=signer, verdict=verdict, invented=reviews.get(result.job_id)))

    qa = [r for r in rows if r.answerable is True]
    qu = [r for r in rows if r.answerable is False]
    reviewed = [r for r in rows if r.invented is not None]
    counted = [r for r in arm_results if r.status == "succeeded"]
    return RunMetrics(
        judge=judgements.judge,
        model=_one_or_mixed(r.model for r in arm_results),
        policy_registered=_one_or_mixed(r.policy_registered for r in counted),
        questions=len(rows),
        answerable=len(qa),
        unanswerable=len(qu),
        unlabelled=len(rows) - len(qa) - len(qu),
        failed=len(failed),
        failed_jobs=[FailedJob(job_id=r.job_id, custom_id=r.custom_id, error=r.error) for r in failed],
        status=StatusSplits[int](all=_status_counts(rows), answerable=_status_counts(qa),
                                 unanswerable=_status_counts(qu)),
        ungrounded_declarations=sum(r.status == "ungrounded" for r in rows),
        ungrounded_declarations_unanswerable=sum(r.status == "ungrounded" for r in qu),
        ungrounded_declarations_answerable=sum(r.status == "ungrounded" for r in qa),
        grounded_unanswerable=sum(r.status == "grounded" for r in qu),
        answerable_answered=sum(r.answered for r in qa),
        answerable_grounded=sum(r.status == "grounded" for r in qa),
        redirects=sum(r.redirects for r in rows),
        violations=sum(r.violation for r in rows),
        undeclared=sum(r.status == "missing" for r in rows),
        invented=sum(bool(r.invented) for r in reviewed) if reviewed else None,
        invented_checked=len(reviewed),
        mean_n_requests=fmean(r.n_requests for r in rows) if rows else None,
        redirect_requests=sum(r.redirects for r in rows),
        refusal=refusal_scores(rows),
        rows=rows,
    )


def load_reviews(path: Path) -> dict[str, bool]:
    """A reviewer's JSONL, one line per answer read: `{"job_id": ..., "invented": 0|1}`. Lines whose
    `invented` is still null (an unfilled template line) are not reviews."""
    reviews: dict[str, bool] = {}
    for line_no, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{line_no}: not valid JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("job_id"), str):
            raise ValueError(f"{path}:{line_no}: a review line is an object with job_id and invented (0 or 1)")
        invented = data.get("invented")
        if invented is None:
            continue
        if invented not in (0, 1, True, False):
            raise ValueError(f"{path}:{line_no}: invented must be 0, 1 or null, got {invented!r}")
        reviews[data["job_id"]] = bool(invented)
    return reviews
