"""GET /v1/batches/{id}/report[?against={id}]: the evaluation report as HTML, from stored results.

The API judges with the rule-based judge only: a judge model called inside a request would make a
page view spend tokens. Model-judged reports come from `grounded experiment|compare --judge`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse

from worker.evaluation.experiment import arm_batches_notes, collect, evaluate
from worker.evaluation.report import render_html
from worker.evaluation.scoring import EvaluationError
from worker.settings import MissingTagKeys

from .deps import CallerDep, ProducerDep, owned_batch

reports = APIRouter(prefix="/v1/batches", tags=["reports"])


@reports.get(
    "/{batch_id}/report",
    response_class=HTMLResponse,
    responses={
        404: {"description": "no such batch for this token's tenant"},
        422: {"description": "stored results that contradict themselves (V6), or not question jobs"},
        503: {"description": "the API has no GROUNDED_TAG_KEYS to verify redirect tags with"},
    },
)
def batch_report(
    batch_id: str,
    request: Request,
    producer: ProducerDep,
    caller: CallerDep,
    against: Annotated[str | None, Query(description="a baseline batch (e.g. the arm without the policy)")] = None,
) -> HTMLResponse:
    """This batch alone, or side by side with `against` as the baseline of the differences."""
    wanted = [against, batch_id] if against else [batch_id]
    batches = [owned_batch(b, producer, caller) for b in wanted]
    arms: dict[str, list[str]] = {}
    for index, batch in enumerate(batches):
        name = batch.arm or ("baseline" if against and index == 0 else batch.id)
        arms[name if name not in arms else f"{name}-{index + 1}"] = [batch.id]
    try:
        signer = request.app.state.settings.signer()
    except MissingTagKeys as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc)) from None
    store = producer.store
    try:
        report = evaluate(collect(store, arms), signer=signer, notes=arm_batches_notes(store, arms))
    except EvaluationError as exc:
        raise HTTPException(422, str(exc)) from None
    return HTMLResponse(render_html(report))
