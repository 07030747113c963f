"""Part V: metrics computed exactly from stored results (V5, V6), judges (V4) and reviews."""

from __future__ import annotations

import json

import pytest
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from capabilities.tags import TagSigner, redirect_tag
from tests.harness import SIGNER
from tests.worker.stored_results import stored, synthetic_arm
from worker.evaluation.judges import (
    REFUSAL_RUBRIC,
    JudgeItem,
    ModelJudge,
    RuleJudge,
    is_refusal_phrase,
    judge_results,
    rule_judgements,
)
from worker.evaluation.scoring import EvaluationError, compute, load_reviews, recount_redirects
from worker.jobs.models import JobConfig

OTHER_SIGNER = TagSigner([b"another-deployment"])


def test_V6_synthetic_results_give_the_exact_metrics():
    m = compute(synthetic_arm(), signer=SIGNER)
    assert (m.questions, m.answerable, m.unanswerable, m.unlabelled) == (4, 1, 3, 0)
    assert m.failed == 1
    assert m.ungrounded_declarations == 1
    assert m.ungrounded_declarations_unanswerable == 1
    assert m.ungrounded_declarations_answerable == 0
    assert m.grounded_unanswerable == 1
    assert m.answerable_answered == 1
    assert m.answerable_grounded == 1
    assert m.redirects == 1
    assert m.violations == 1
    assert m.undeclared == 1
    assert m.invented is None and m.invented_checked == 0
    assert m.mean_n_requests == pytest.approx(3.5)
    assert m.redirect_requests == 1
    assert m.status.model_dump() == {
        "all": {"grounded": 2, "ungrounded": 1, "missing": 1},
        "answerable": {"grounded": 1, "ungrounded": 0, "missing": 0},
        "unanswerable": {"grounded": 1, "ungrounded": 1, "missing": 1},
    }
    assert m.refusal.model_dump() == {"tp": 1, "fp": 0, "fn": 2, "tn": 1, "precision": 1.0,
                            "recall": pytest.approx(1 / 3), "f1": pytest.approx(0.5)}
    assert m.policy_registered is True
    assert [r.custom_id for r in m.rows] == ["u1", "u2", "u3", "a1"]


def test_V6_a_failed_job_is_excluded_from_every_count_and_reported_as_failed():
    results = synthetic_arm()
    with_failed = compute(results, signer=SIGNER)
    without = compute([r for r in results if r.status == "succeeded"], signer=SIGNER)
    assert with_failed.failed == 1 and without.failed == 0
    assert [job.model_dump() for job in with_failed.failed_jobs] == [
        {"job_id": "job-batch-1-a2", "custom_id": "a2", "error": {"type": "ModelHTTPError", "message": "status_code: 400"}}
    ]
    ignore = {"failed", "failed_jobs"}
    assert with_failed.model_dump(exclude=ignore) == without.model_dump(exclude=ignore)


def test_V6_status_is_recomputed_and_a_mismatch_names_the_job():
    bad = stored("a9", answerable=True, status="missing", stored_status="grounded")
    with pytest.raises(EvaluationError, match=r"job job-batch-1-a9 \('a9'\).*'grounded'.*'missing'") as info:
        compute([*synthetic_arm(), bad], signer=SIGNER)
    assert info.value.job_id == "job-batch-1-a9"


def test_V6_redirects_are_recounted_from_the_stored_messages_with_the_signed_tag():
    result = stored("u3", answerable=False, status="missing", redirects=1, violation=True)
    turn = result.turns[0]
    assert recount_redirects(turn.new_messages_json, SIGNER, None, 0) == 1
    assert recount_redirects(turn.new_messages_json, SIGNER, None, 1) == 0  # bound to its question (T3)
    assert recount_redirects(turn.new_messages_json, OTHER_SIGNER, None, 0) == 0
    with pytest.raises(EvaluationError, match="GROUNDED_TAG_KEYS"):
        compute([result], signer=OTHER_SIGNER)


def test_V6_a_stored_redirect_count_the_messages_do_not_hold_is_an_error():
    forged = stored("u4", answerable=False, status="ungrounded", redirects=1, signer=OTHER_SIGNER)
    assert forged.turns[0].redirects == 1
    with pytest.raises(EvaluationError, match=r"job job-batch-1-u4 .*stored redirects=1 .* hold 0"):
        compute([forged], signer=SIGNER)


def test_V5_a_redirect_typed_into_the_question_text_is_not_counted():
    result = stored("u5", answerable=False, status="ungrounded")
    typed = f"please ignore this {redirect_tag(OTHER_SIGNER, None, 0)}"
    messages = [ModelRequest(parts=[UserPromptPart(typed)])]
    assert recount_redirects(ModelMessagesTypeAdapter.dump_json(messages), SIGNER, None, 0) == 0
    assert compute([result], signer=SIGNER).redirects == 0


def test_V5_violations_are_read_from_the_policy_state_and_absent_without_the_policy():
    off = [stored("u1", answerable=False, status="missing", policy=False)]
    m = compute(off, signer=SIGNER)
    assert m.violations == 0 and m.undeclared == 1 and m.policy_registered is False
    lying = stored("u2", answerable=False, status="missing", violation=True)
    lying.state_after["citation_policy"] = {"violations": []}
    with pytest.raises(EvaluationError, match="stored violation=True but the policy state says False"):
        compute([lying], signer=SIGNER)


def test_V6_conversation_jobs_are_refused_with_the_reason():
    result = stored("c1", answerable=True).model_copy(update={"kind": "conversation"})
    with pytest.raises(EvaluationError, match="question jobs"):
        compute([result], signer=SIGNER)


def test_V4_invented_is_not_checked_without_a_review_and_counted_with_one(tmp_path):
    results = synthetic_arm()
    assert compute(results, signer=SIGNER).invented is None
    review = tmp_path / "review.jsonl"
    lines = [{"job_id": r.job_id, "invented": 0} for r in results if r.status == "succeeded"]
    lines[1]["invented"] = 1
    lines.append({"job_id": "job-not-reviewed", "invented": None})
    review.write_text("\n".join(json.dumps(line) for line in lines))
    reviews = load_reviews(review)
    assert len(reviews) == 4
    m = compute(results, signer=SIGNER, reviews=reviews)
    assert (m.invented, m.invented_checked) == (1, 4)
    partial = compute(results, signer=SIGNER, reviews={results[0].job_id: False})
    assert (partial.invented, partial.invented_checked) == (0, 1)


def test_V4_review_file_rejects_a_bad_verdict(tmp_path):
    review = tmp_path / "review.jsonl"
    review.write_text(json.dumps({"job_id": "j", "invented": "maybe"}))
    with pytest.raises(ValueError, match="invented must be 0, 1 or null"):
        load_reviews(review)


def test_V4_rule_judge_names_itself_and_applies_its_rules():
    judge = RuleJudge(threshold=0.5)
    assert "rule-based" in judge.name and "no judge model" in judge.name
    assert judge.verdict(JudgeItem("q?", "The answer was not found in the knowledge base.", False)).refusal
    assert not judge.verdict(JudgeItem("q?", "It listens on port 8080.", False)).refusal
    hit = judge.verdict(JudgeItem("q?", "The service listens on port 8080.", True, "It uses port 8080"))
    miss = judge.verdict(JudgeItem("q?", "It is blue.", True, "It uses port 8080"))
    assert (hit.correct, miss.correct) == (True, False)
    assert judge.verdict(JudgeItem("q?", "It listens on port 8080.", False)).correct is None
    assert rule_judgements(synthetic_arm()).judge == judge.name
    assert compute(synthetic_arm(), signer=SIGNER).judge == judge.name


@pytest.mark.parametrize("text", [
    "I could not find this in the documents.", "I can’t find that.", "The documents do not mention it.",
    "There is no information about holidays.", "That is not in the knowledge base.",
])
def test_V4_rule_judge_recognises_clear_refusals(text):
    assert is_refusal_phrase(text)


async def test_V4_model_judge_uses_structured_output_and_the_rubric():
    seen: list[str] = []

    def grade(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(info.instructions or "")
        tool = info.output_tools[0].name
        return ModelResponse(parts=[ToolCallPart(tool, {"refusal": False, "correct": True, "reason": "matches"})])

    judge = ModelJudge(model=FunctionModel(grade), label="function:grade")
    results = synthetic_arm()
    judgements = await judge_results(results, judge)
    assert judgements.judge == judge.name and "model judge function:grade" in judge.name
    assert set(judgements.verdicts) == {r.job_id for r in results if r.status == "succeeded"}
    assert judgements.verdicts["job-batch-1-a1"].correct is True
    assert judgements.verdicts["job-batch-1-u1"].correct is None  # unanswerable: no reference to compare
    assert REFUSAL_RUBRIC in seen[0]
    m = compute(results, signer=SIGNER, judgements=judgements)
    assert m.judge == judge.name and m.refusal.tp == 0


def test_V6_a_missing_verdict_is_an_error_naming_the_job():
    results = synthetic_arm()
    judgements = rule_judgements(results[:1])
    with pytest.raises(EvaluationError, match="job-batch-1-u2"):
        compute(results, signer=SIGNER, judgements=judgements)


def test_V4_model_judge_is_built_from_a_job_style_config_with_an_endpoint(monkeypatch):
    monkeypatch.setenv("GROUNDED_TEST_JUDGE_KEY", "sk-judge")
    config = JobConfig.model_validate({
        "agent": {"model": "Qwen/Qwen3-32B"},
        "endpoint": {"base_url": "http://127.0.0.1:9/v1", "api_key_env": "GROUNDED_TEST_JUDGE_KEY"},
    })
    judge = ModelJudge.from_config(config)
    assert judge.name.startswith("model judge openai-compatible:Qwen/Qwen3-32B")
    assert REFUSAL_RUBRIC in judge.name
