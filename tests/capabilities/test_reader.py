"""Document reader: E7, E8, E9, E4(c) and the reader variants of E14."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import BinaryContent, UserPromptPart

from capabilities.budgets import exhausted_notice
from capabilities.citing import cite_ack
from capabilities.formatting import EMPTY_PAGE, NO_DOCUMENTS
from capabilities.ledger import citation_status
from capabilities.passages import create_passages
from capabilities.reader import (
    LISTING_LIMIT_REACHED,
    PAGE_OR_SECTION,
    READ_LIMIT_REACHED,
    ReaderState,
    create_reader,
    not_found_message,
)
from capabilities.store import Chunk
from capabilities.tags import is_our_picture
from tests.harness import (
    PNG,
    SIGNER,
    Deps,
    FakeCorpus,
    ScriptedModel,
    call,
    respond,
    tool_returns,
)


def rl(call_id: str = "rl1", **args: Any):
    return call("reader_list_documents", args, call_id)


def rr(document_id: str, call_id: str = "rr1", **args: Any):
    return call("reader_read", {"document_id": document_id, **args}, call_id)


def rc(*chunk_ids: str, call_id: str = "rc1"):
    return call("reader_cite", {"chunk_ids": list(chunk_ids)}, call_id)


def state(deps: Deps) -> ReaderState:
    return ReaderState.model_validate(deps.state["reader"])


async def run(corpus: FakeCorpus, turns: list, deps: Deps, **options: Any) -> ScriptedModel:
    model = ScriptedModel(turns)
    await Agent(model, capabilities=[create_reader(corpus, SIGNER, **options)], deps_type=Deps).run("q", deps=deps)
    return model


def returned(model: ScriptedModel, k: int):
    return tool_returns(model.wire(k))[-1]


# --- E7 reader_list_documents ------------------------------------------------------------------


async def test_E7_two_documents_are_listed_and_the_listing_is_an_outcome(corpus, deps):
    model = await run(corpus, [respond(rl()), respond(rc()), respond("two documents")], deps)
    assert returned(model, 2).content.splitlines() == [
        '[d-1] "Handbook" (file://d-1.md), pages 5',
        '[d-2] "Guide" (file://d-2.md), pages 4',
    ]
    assert state(deps).evidence.latest_evidence_epoch == 1
    assert state(deps).working_set == {}
    assert citation_status([state(deps).evidence], question=0) == "ungrounded"


async def test_E7_an_empty_page_of_listings_says_so_and_is_an_outcome(corpus, deps):
    model = await run(corpus, [respond(rl(offset=10)), respond("a")], deps)
    assert returned(model, 2).content == NO_DOCUMENTS
    assert state(deps).evidence.latest_evidence_epoch == 1


async def test_E7_listing_follows_the_document_filter_and_its_budget(corpus):
    deps = Deps(state={"reader": {"document_filter": "d-2"}})
    model = await run(corpus, [respond(rl()), respond(rl("rl2")), respond("a")], deps, max_listings=1)
    assert returned(model, 2).content.startswith("[d-2]") and "d-1" not in returned(model, 2).content
    assert (returned(model, 3).outcome, returned(model, 3).content) == ("failed", LISTING_LIMIT_REACHED)
    assert corpus.count("list_documents") == 1


# --- E8 reader_read ----------------------------------------------------------------------------


async def test_E8_reading_a_page_shows_blocks_pictures_and_keeps_a_working_set_entry(corpus, deps):
    model = await run(corpus, [respond(rr("d-1", page=1)), respond(rc("c-1")), respond("a")], deps, vision=True)
    request = model.wire(2)[-1]
    assert returned(model, 2).content.startswith("[c-1] [rank 1 of 1]")
    label, image = [p for p in request.parts if isinstance(p, UserPromptPart)][0].content
    assert image == BinaryContent(data=PNG, media_type="image/png") and is_our_picture(SIGNER, label, image)
    assert [r.chunk_id for r in state(deps).working_set["read:d-1:1"]] == ["c-1"]
    assert returned(model, 3).content == cite_ack(1)
    assert state(deps).evidence.occurrences["c-1"].retrieved_in_questions == [0]


async def test_E8_sections_and_the_document_start_have_their_own_keys(corpus, deps):
    turns = [respond(rr("d-2", section="Section 7")), respond(rr("d-1", "rr2")), respond("a")]
    await run(corpus, turns, deps)
    assert {k: [r.chunk_id for r in v] for k, v in state(deps).working_set.items()} == {
        "read:d-2:Section 7": ["c-7"],
        "read:d-1:start": ["c-1"],
    }


async def test_E8_an_empty_page_says_so_and_is_an_outcome(corpus, deps):
    corpus.chunks = {k: c for k, c in corpus.chunks.items() if k != "c-3"}
    model = await run(corpus, [respond(rr("d-1", page=3)), respond("a")], deps)
    assert returned(model, 2).content == EMPTY_PAGE
    assert state(deps).evidence.latest_evidence_epoch == 1
    assert state(deps).working_set == {"read:d-1:3": []}


async def test_E4c_reading_an_unknown_document_fails_and_is_no_outcome(corpus, deps):
    model = await run(corpus, [respond(rr("d-404")), respond("a")], deps)
    failed = returned(model, 2)
    assert (failed.outcome, failed.content) == ("failed", not_found_message("d-404", None, None))
    assert state(deps).evidence.latest_evidence_epoch == 0


async def test_E8_unknown_pages_and_sections_are_named(corpus, deps):
    model = await run(corpus, [respond(rr("d-1", page=9)), respond(rr("d-1", "rr2", section="Nope")), respond("a")],
                      deps)
    assert returned(model, 2).content == not_found_message("d-1", 9, None)
    assert "9" in returned(model, 2).content and "d-1" in returned(model, 2).content
    assert returned(model, 3).content == not_found_message("d-1", None, "Nope")
    assert state(deps).evidence.latest_evidence_epoch == 0


async def test_E8_a_document_outside_the_filter_is_not_found(corpus):
    deps = Deps(state={"reader": {"document_filter": "d-2"}})
    model = await run(corpus, [respond(rr("d-1", page=1)), respond("a")], deps)
    assert returned(model, 2).outcome == "failed"
    assert ("read", ("d-1", 1, None, "d-2")) in corpus.calls
    assert state(deps).working_set == {}


async def test_E8_page_and_section_together_are_refused_without_spending_the_budget(corpus, deps):
    turns = [respond(rr("d-1", page=1, section="Section 1")), respond(rr("d-1", "rr2", page=1)), respond("a")]
    model = await run(corpus, turns, deps, max_reads=1)
    assert (returned(model, 2).outcome, returned(model, 2).content) == ("failed", PAGE_OR_SECTION)
    assert returned(model, 3).outcome == "success"
    assert corpus.count("read") == 1


async def test_E8_reads_beyond_the_budget_fail(corpus, deps):
    model = await run(corpus, [respond(rr("d-1", page=1)), respond(rr("d-1", "rr2", page=2)), respond("a")], deps,
                      max_reads=1)
    assert (returned(model, 3).outcome, returned(model, 3).content) == ("failed", READ_LIMIT_REACHED)
    assert list(state(deps).working_set) == ["read:d-1:1"]


async def test_E8_a_reader_citation_of_a_read_chunk_grounds_under_the_reader(corpus, deps):
    corpus.add_chunk(Chunk(id="c-10", document_id="d-2", ordinal=5, content="late page", page_numbers=[4]))
    await run(corpus, [respond(rr("d-2", page=4)), respond(rc("c-9", "c-10")), respond("a")], deps)
    assert state(deps).citations == ["c-9", "c-10"]
    assert {o.capability for o in state(deps).evidence.occurrences.values()} == {"reader"}


# --- E9 / E14 reader variants ------------------------------------------------------------------


def test_E9_reader_evidence_tools_never_include_cite(corpus):
    reader = create_reader(corpus, SIGNER)
    assert reader.evidence_tool_names() == frozenset({"reader_list_documents", "reader_read"})
    assert reader.cite_tool_name == "reader_cite"
    assert create_passages(corpus, SIGNER).evidence_tool_names() == frozenset({"passages_search"})


def test_E14_a_spent_read_points_at_the_listing_or_citing(corpus):
    reader = replace(create_reader(corpus, SIGNER), uses={"reader_read": 8})
    notice = reader.budget_notice()
    assert notice == exhausted_notice(["reader_read"], ["reader_list_documents"], "reader_cite")
    assert notice.startswith("reader_read is exhausted")
    assert "reader_list_documents" in notice and "reader_cite" in notice


def test_E14_with_every_reader_tool_spent_the_notice_says_to_answer_and_cite(corpus):
    reader = replace(create_reader(corpus, SIGNER), uses={"reader_read": 8, "reader_list_documents": 3})
    notice = reader.budget_notice()
    assert notice == exhausted_notice(["reader_list_documents", "reader_read"], [], "reader_cite")
    assert "Answer" in notice and "reader_cite" in notice


async def test_E14_a_spent_read_notice_reaches_the_next_request(corpus, deps):
    model = await run(corpus, [respond(rr("d-1", page=1)), respond("a")], deps, max_reads=1)
    assert exhausted_notice(["reader_read"], ["reader_list_documents"], "reader_cite") in model.instructions(2)
    assert {"reader_read", "reader_list_documents", "reader_cite"} <= model.offered(2)
