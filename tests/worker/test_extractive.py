"""The offline extractive model: search, cite what overlaps, answer with it (or refuse)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from capabilities.formatting import NO_RESULTS, RESULT_SEPARATOR
from tests.harness import SIGNER
from tests.worker.conftest import CORPUS
from worker.jobs.models import Batch, Job, JobConfig
from worker.runtime.agents import AgentCache
from worker.runtime.extractive import CITE_TOOL, NOT_FOUND, SEARCH_TOOL, next_parts, parse_results, supporting
from worker.runtime.llms import ModelCache
from worker.runtime.run import Runtime, run_job

OFFERED = frozenset({SEARCH_TOOL, CITE_TOOL})
RESULTS = RESULT_SEPARATOR.join([
    "[c-1] [rank 1 of 2]\nSource: \"Handbook\"\nType: text\nContent:\nThe dome opens at 19:00. Bring a torch.",
    "[c-2] [rank 2 of 2]\nSource: \"Handbook\"\nType: text\nContent:\nParking is free on weekdays.",
])


def test_results_are_read_back_from_the_search_format() -> None:
    assert [(p.chunk_id, p.content) for p in parse_results(RESULTS)] == [
        ("c-1", "The dome opens at 19:00. Bring a torch."), ("c-2", "Parking is free on weekdays.")]
    assert parse_results(NO_RESULTS) == []


def test_support_needs_enough_shared_content_words() -> None:
    passages = parse_results(RESULTS)
    [support] = supporting("When does the dome open?", passages, min_overlap=0.5, max_sentences=3)
    assert (support.chunk_id, support.sentence) == ("c-1", "The dome opens at 19:00.")
    assert supporting("What does the dome cost?", passages, min_overlap=0.5, max_sentences=3) == []


def test_it_searches_then_cites_then_answers() -> None:
    question = [ModelRequest(parts=[UserPromptPart("When does the dome open?")])]
    [search] = next_parts(question, OFFERED)
    assert isinstance(search, ToolCallPart) and search.args == {"query": "When does the dome open?"}
    searched = [*question, ModelResponse(parts=[search]),
                ModelRequest(parts=[ToolReturnPart(SEARCH_TOOL, RESULTS, tool_call_id=search.tool_call_id)])]
    [cite] = next_parts(searched, OFFERED)
    assert cite.tool_name == CITE_TOOL and cite.args == {"chunk_ids": ["c-1"]}
    cited = [*searched, ModelResponse(parts=[cite]),
             ModelRequest(parts=[ToolReturnPart(CITE_TOOL, "ok", tool_call_id=cite.tool_call_id)])]
    assert next_parts(cited, OFFERED) == [TextPart("The dome opens at 19:00.")]


def test_nothing_overlapping_cites_nothing_and_says_not_found() -> None:
    question = [ModelRequest(parts=[UserPromptPart("Who won the 1998 cup final?")]),
                ModelResponse(parts=[ToolCallPart(SEARCH_TOOL, {"query": "q"}, tool_call_id="s")]),
                ModelRequest(parts=[ToolReturnPart(SEARCH_TOOL, RESULTS, tool_call_id="s")])]
    [cite] = next_parts(question, OFFERED)
    assert cite.args == {"chunk_ids": []}
    assert next_parts(question, frozenset()) == [TextPart(NOT_FOUND)]


def test_deterministic_answers_over_a_real_corpus(data_dir: Path) -> None:
    """Same question, same corpus → the same answer, citations and status, run after run."""
    import asyncio

    config = JobConfig.model_validate({"agent": {"model": "extractive", "capabilities": [
        {"PassageSearchCapability": {"corpus": CORPUS}}, "CitationPolicyCapability"]}})
    runtime = Runtime(agents=AgentCache(signer=SIGNER, corpora_dir=data_dir / "corpora"), models=ModelCache(),
                      signer=SIGNER)
    batch = Batch(id="b", tenant="t", config=config, total=1, created_at=datetime.now(UTC))

    def answer(question: str):
        job = Job(line_no=1, custom_id="c", kind="question", question=question, id="job_x", batch_id="b")
        turn = asyncio.run(run_job(job, batch, runtime)).turns[0]
        return turn.answer, turn.citation_status, [c.chunk_id for c in turn.cited]

    first = answer("How large is the mirror of the reflector?")
    assert first == answer("How large is the mirror of the reflector?")
    assert first[1] == "grounded" and "400 mm" in first[0]
    assert answer("Who painted the Mona Lisa?") == (NOT_FOUND, "ungrounded", [])
