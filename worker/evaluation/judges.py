"""Refusal and correctness judgements (V4) for evaluation, from a model or from plain rules.

The metrics depend on these verdicts, so the report always names the judge that gave them: a
configured model judge with the V4 rubric, or otherwise a rule-based judge that says it is one and
states its rules, so a reader knows how far to trust "answered" and the refusal scores.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, Field

from worker.jobs.models import JobConfig, JobResult

REFUSAL_RUBRIC = (
    "the answer declines: it says the information is not available, cannot be found or is unknown, "
    "instead of answering"
)
CORRECT_RUBRIC = (
    "the answer states the reference answer's key facts and does not contradict them; extra detail is "
    "fine, and a refusal is never correct"
)

# Clear ways of declining, as answers phrase them; bare words such as "unknown" are left out because
# they also occur in answers that do answer.
REFUSAL_PATTERNS: tuple[str, ...] = (
    r"\bnot\s+(?:be\s+)?found\b",
    r"\b(?:could\s*(?:not|n't)|did\s*(?:not|n't)|can't|cannot|can\s+not)\s+(?:find|locate|determine|answer)\b",
    r"\bunable\s+to\s+(?:find|locate|determine|answer)\b",
    r"\bno\s+(?:relevant\s+)?(?:information|mention|details?|data|record)\b",
    r"\b(?:is|are)\s*(?:not|n't)\s+(?:available|mentioned|covered|specified|stated|documented)\b",
    r"\b(?:does|do)\s*(?:not|n't)\s+(?:contain|mention|cover|say|specify|include|provide)\b",
    r"\b(?:do|does)\s*(?:not|n't)\s+know\b",
    r"\bnot\s+(?:in|part of)\s+the\s+(?:knowledge\s+base|documents?|corpus)\b",
    r"\bnot\s+enough\s+information\b",
)
_REFUSAL = re.compile("|".join(f"(?:{p})" for p in REFUSAL_PATTERNS), re.IGNORECASE)
_STOPWORDS = frozenset(
    """a an and are as at be by for from has have in is it its of on or that the this to was were which with
    what when where who how why does do did can could would should will not no""".split()
)


@dataclass(frozen=True)
class JudgeItem:
    """What a judge sees of one answer: nothing about citations, so grounding cannot sway it."""

    question: str
    answer: str
    answerable: bool | None
    reference_answer: str | None = None


class Verdict(BaseModel):
    refusal: bool
    correct: bool | None = None  # judged for answerable items only
    reason: str = ""


class Judge(Protocol):
    """Names itself, because the report must say who judged refusal and correctness."""

    @property
    def name(self) -> str: ...

    async def __call__(self, item: JudgeItem) -> Verdict: ...


@dataclass(frozen=True)
class Judgements:
    judge: str
    verdicts: Mapping[str, Verdict] = field(default_factory=dict)  # by job_id


def answer_text(answer: str | dict[str, Any] | list[Any] | None) -> str:
    """Structured answers are judged on their JSON, which holds every field the model returned."""
    if answer is None:
        return ""
    if isinstance(answer, str):
        return answer
    return json.dumps(answer, ensure_ascii=False, sort_keys=True)


def content_words(text: str) -> set[str]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w
            for w in words if w not in _STOPWORDS and (len(w) > 1 or w.isdigit())}


def reference_overlap(answer: str, reference: str) -> float:
    """The share of the reference answer's content words that the answer contains."""
    wanted = content_words(reference)
    if not wanted:
        return 0.0
    return len(wanted & content_words(answer)) / len(wanted)


def is_refusal_phrase(answer: str) -> bool:
    return _REFUSAL.search(answer.replace("\u2019", "'")) is not None


@dataclass(frozen=True)
class RuleJudge:
    """Transparent and offline: used when no judge model is configured, and reported as such."""

    threshold: float = 0.5

    @property
    def name(self) -> str:
        return (
            "rule-based judge (no judge model configured): refusal = the answer matches a clear refusal "
            f"phrasing; correct = at least {self.threshold:.0%} of the reference answer's content words "
            "appear in the answer"
        )

    def verdict(self, item: JudgeItem) -> Verdict:
        refusal = is_refusal_phrase(item.answer)
        if item.answerable is not True or not item.reference_answer:
            return Verdict(refusal=refusal, reason="refusal phrasing" if refusal else "")
        overlap = reference_overlap(item.answer, item.reference_answer)
        return Verdict(
            refusal=refusal,
            correct=overlap >= self.threshold,
            reason=f"{'refusal phrasing; ' if refusal else ''}reference overlap {overlap:.2f}",
        )

    async def __call__(self, item: JudgeItem) -> Verdict:
        return self.verdict(item)


class _ModelVerdict(BaseModel):
    refusal: bool = Field(description=f"true iff {REFUSAL_RUBRIC}")
    correct: bool | None = Field(
        default=None, description=f"for questions with a reference answer: true iff {CORRECT_RUBRIC}; else null"
    )
    reason: str = Field(default="", description="one short sentence")


JUDGE_INSTRUCTIONS = (
    "You grade one answer to one question. You are shown the question, the answer and, when there is "
    f"one, a reference answer.\nrefusal: true iff {REFUSAL_RUBRIC}.\ncorrect (only when a reference "
    f"answer is given, else null): true iff {CORRECT_RUBRIC}.\nJudge the text only; do not answer the "
    "question yourself."
)


@dataclass
class ModelJudge:
    """V4's LLM judge: a pydantic-ai agent with structured output, model from a job-style config."""

    model: Any  # a pydantic-ai Model (or a model name pydantic-ai can infer)
    label: str
    _agent: Any = field(default=None, init=False, repr=False)

    @classmethod
    def from_config(cls, config: JobConfig) -> ModelJudge:
        """`agent.model` and `endpoint` are read as for jobs, so keys come from this process's env."""
        from worker.jobs.allowlist import model_label
        from worker.runtime.llms import build_model

        return cls(model=build_model(config), label=model_label(config))

    @property
    def name(self) -> str:
        return f"model judge {self.label} (V4 rubric: refusal = {REFUSAL_RUBRIC}; correct = {CORRECT_RUBRIC})"

    def _agent_for_run(self) -> Any:
        if self._agent is None:
            from pydantic_ai import Agent

            self._agent = Agent(self.model, output_type=_ModelVerdict, instructions=JUDGE_INSTRUCTIONS, retries=2)
        return self._agent

    async def __call__(self, item: JudgeItem) -> Verdict:
        lines = [f"Question:\n{item.question}", f"Answer:\n{item.answer or '(empty)'}"]
        if item.answerable is True and item.reference_answer:
            lines.append(f"Reference answer:\n{item.reference_answer}")
        result = await self._agent_for_run().run("\n\n".join(lines))
        out: _ModelVerdict = result.output
        correct = out.correct if item.answerable is True and item.reference_answer else None
        return Verdict(refusal=out.refusal, correct=correct, reason=out.reason)


def judge_item(result: JobResult) -> JudgeItem:
    turn = result.turns[-1]
    answerable = answerable_label(result)
    reference = result.metadata.get("reference_answer")
    return JudgeItem(
        question=turn.question_text,
        answer=answer_text(turn.answer),
        answerable=answerable,
        reference_answer=reference if isinstance(reference, str) else None,
    )


def answerable_label(result: JobResult) -> bool | None:
    """V3's label, as a job line carries it: `answerable: true|false` or `answerability: answerable|unanswerable`."""
    value = result.metadata.get("answerable")
    if isinstance(value, bool):
        return value
    answerability = result.metadata.get("answerability")
    if answerability in ("answerable", "unanswerable"):
        return answerability == "answerable"
    return None


def rule_judgements(results: Sequence[JobResult], judge: RuleJudge | None = None) -> Judgements:
    judge = judge or RuleJudge()
    return Judgements(
        judge=judge.name,
        verdicts={r.job_id: judge.verdict(judge_item(r)) for r in results if r.status == "succeeded" and r.turns},
    )


async def judge_results(results: Sequence[JobResult], judge: Judge, *, concurrency: int = 4) -> Judgements:
    """Judges every succeeded answer once; a judge model error fails the evaluation, never a verdict."""
    gate = asyncio.Semaphore(concurrency)
    todo = [r for r in results if r.status == "succeeded" and r.turns]

    async def one(result: JobResult) -> tuple[str, Verdict]:
        async with gate:
            return result.job_id, await judge(judge_item(result))

    pairs = await asyncio.gather(*(one(r) for r in todo))
    return Judgements(judge=judge.name, verdicts=dict(pairs))
