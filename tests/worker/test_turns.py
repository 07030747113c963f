"""H10 fields computed from state and new messages (pure)."""

from __future__ import annotations

import hashlib

from pydantic_ai.messages import (
    BinaryContent,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolReturnPart,
    UserPromptPart,
)

from capabilities.policy import redirects_delivered
from capabilities.tags import TagSigner, redirect_tag
from tests.harness import PNG, SIGNER
from worker.jobs.models import Usage
from worker.runtime.turns import summarize_turn, wire_json


def test_wire_transcripts_carry_picture_digests_not_bytes() -> None:
    picture = BinaryContent(PNG, media_type="image/png")
    request = ModelRequest(parts=[UserPromptPart(["Knowledge-base picture", picture])])
    [[message]] = wire_json([[request]])
    image = message["parts"][0]["content"][1]
    assert "data" not in image
    assert image["sha256"] == hashlib.sha256(PNG).hexdigest() and image["bytes"] == len(PNG)
    assert image["media_type"] == "image/png"


def test_only_verifying_redirect_tags_for_the_question_count() -> None:
    ours = f"Please cite. {redirect_tag(SIGNER, 'job_1', 0)}"
    forged = f"Please cite. {redirect_tag(TagSigner([b'other']), 'job_1', 0)}"
    other_question = f"Please cite. {redirect_tag(SIGNER, 'job_1', 4)}"
    messages = [ModelRequest(parts=[UserPromptPart(text)]) for text in (ours, forged, other_question)]
    assert redirects_delivered(messages, SIGNER, "job_1", 0) == 1
    assert redirects_delivered(messages, SIGNER, "job_2", 0) == 0


def test_H10_turn_fields_from_state_and_messages() -> None:
    state = {
        "passages": {
            "citation_index": {"c-1": {"chunk_id": "c-1", "document_id": "d-1", "document_uri": "doc://1",
                                       "document_title": "One", "content": "Opens at 19:00.", "page_numbers": [2],
                                       "headings": ["Visiting", "Hours"]}},
            "evidence": {"question": 0, "in_progress": False, "latest_evidence_epoch": 1,
                         "declaration": {"question": 0, "epoch": 3,
                                         "refs": [{"capability": "passages", "chunk_id": "c-1"}]},
                         "occurrences": {"c-1": {"capability": "passages", "chunk_id": "c-1",
                                                 "retrieved_in_questions": [0], "cited_in_questions": [0]}}},
        },
        "citation_policy": {"violations": []},
    }
    new = [
        ModelRequest(parts=[UserPromptPart("When?")]),
        ModelResponse(parts=[TextPart("x")]),
        ModelRequest(parts=[ToolReturnPart("passages_cite", "bad", tool_call_id="a", outcome="failed")]),
        ModelResponse(parts=[TextPart("Opens at 19:00.")]),
    ]
    turn = summarize_turn(question_text="When?", history_length=0, output="Opens at 19:00.", new_messages=new,
                          state=state, namespaces=("passages",), signer=SIGNER, conversation_id="job_1",
                          usage=Usage(input_tokens=5, output_tokens=2), wire=[new[:1], new[:3]])
    assert (turn.question_identity, turn.citation_status, turn.violation, turn.redirects) == (0, "grounded", False, 0)
    assert turn.declared_refs == [{"capability": "passages", "chunk_id": "c-1"}]
    assert turn.cited[0].model_dump() == {"capability": "passages", "chunk_id": "c-1", "document_id": "d-1",
                                          "document_uri": "doc://1", "document_title": "One",
                                          "content": "Opens at 19:00.", "page_numbers": [2],
                                          "headings": ["Visiting", "Hours"],
                                          "retrieved_this_question": True}
    assert (turn.n_requests, turn.failed_tool_returns, len(turn.wire)) == (2, 1, 2)
