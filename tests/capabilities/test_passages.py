"""Passage search and citing: E4-E6, E10-E16 and the regressions R23-R31."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    BinaryContent,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)
from pydantic_ai.usage import RunUsage

from capabilities.base import GRACE_REQUESTS, EvidenceState
from capabilities.budgets import (
    called_own_tool,
    exhausted_notice,
    request_limit_notice,
    withdrawn_notice,
)
from capabilities.citing import CITE_NONE_ACK, cite_ack, no_citation_message
from capabilities.formatting import NO_RESULTS, RESULT_SEPARATOR
from capabilities.ledger import CapabilityEvidenceRecord, citation_status
from capabilities.passages import SEARCH_LIMIT_REACHED, PassagesState, create_passages
from capabilities.reader import create_reader
from capabilities.store import Chunk, RetrievedChunk
from capabilities.tags import is_our_picture
from tests.harness import (
    PNG,
    SIGNER,
    Deps,
    FakeCorpus,
    ScriptedModel,
    call,
    pc,
    ps,
    respond,
    tool_returns,
)

UUID = "b8e25ea1-0bb3-48b1-8fea-2ac1f148bf7c"
UNRELATED = "9c2cd07e-5a3f-45a6-968d-cbd6f06ab57b"


def state(deps: Deps) -> PassagesState:
    return PassagesState.model_validate(deps.state["passages"])


def record(deps: Deps) -> CapabilityEvidenceRecord:
    return state(deps).evidence


def host(ctx: RunContext[Any], note: str = "") -> str:
    """A host tool that is not an evidence tool."""
    return "ok"


async def run(corpus: FakeCorpus, turns: list, deps: Deps | None = None, *extra: Any, **options: Any) -> ScriptedModel:
    model = ScriptedModel(turns)
    agent = Agent(model, capabilities=[create_passages(corpus, SIGNER, **options), *extra], tools=[host],
                  deps_type=Deps)
    await agent.run("q", deps=deps if deps is not None else Deps())
    return model


def returns(model: ScriptedModel, k: int) -> list[Any]:
    return [p.content for p in tool_returns(model.wire(k))]


# --- E4 evidence outcomes ----------------------------------------------------------------------


async def test_E4a_R26_a_search_without_hits_returns_no_results_and_is_an_outcome(corpus, deps):
    model = await run(corpus, [respond(ps("nothing-matches-this")), respond("a")], deps)
    assert returns(model, 2) == [NO_RESULTS]
    assert record(deps).latest_evidence_epoch == 1


async def test_E4b_a_search_refused_by_its_budget_is_no_outcome(corpus, deps):
    model = await run(corpus, [respond(ps("masks")), respond("a")], deps, max_searches=0)
    failed = tool_returns(model.wire(2))[0]
    assert (failed.outcome, failed.content) == ("failed", SEARCH_LIMIT_REACHED)
    assert "limit reached" in failed.content
    assert record(deps).latest_evidence_epoch == 0
    assert corpus.count("search") == 0


# --- E5 instructions ---------------------------------------------------------------------------


async def test_E5_instructions_carry_the_preamble_and_the_heading_once(corpus):
    preamble = "You answer questions about the staff handbook."
    model = await run(corpus, [respond("a")], None, create_reader(corpus, SIGNER), instructions_preamble=preamble)
    instructions = model.infos[0].instructions or ""
    assert instructions.count(preamble) == 1
    assert instructions.count("## Knowledge-base search") == 1
    for required in ("passages_cite", "empty list", "verbatim", "Never write chunk ids", "the user attached",
                     "budget is spent"):
        assert required in instructions


# --- E6 passages_search ------------------------------------------------------------------------


async def test_E6a_R25_a_narrower_repeat_of_a_query_keeps_the_wider_results(corpus, deps):
    corpus.results_for["Figure 3-1"] = ["c-1", "c-2", "c-3"]
    turns = [respond(ps("Figure 3-1", limit=20)), respond(ps("Figure 3-1", "ps2")), respond("a")]
    await run(corpus, turns, deps, search_limit=1)
    assert [args[1] for name, args in corpus.calls if name == "search"] == [20, 1]
    assert [r.chunk_id for r in state(deps).working_set["Figure 3-1"]] == ["c-1", "c-2", "c-3"]


async def test_E6b_R26_zero_results_give_exactly_no_results(corpus):
    corpus.results_for["empty"] = []
    model = await run(corpus, [respond(ps("empty")), respond("a")])
    assert returns(model, 2) == [NO_RESULTS]


async def test_E6_results_are_blocks_with_id_rank_source_type_captions_and_content(corpus):
    corpus.results_for["two"] = ["c-1", "c-2"]
    model = await run(corpus, [respond(ps("two")), respond("a")])
    first, second = returns(model, 2)[0].split(RESULT_SEPARATOR)
    assert first.splitlines() == [
        "[c-1] [rank 1 of 2]",
        'Source: "Handbook" > Section 1',
        "Type: text",
        "Figure caption (#/pictures/0): Figure 1",
        "Content:",
        "chunk 1 content about topic1 and masks",
    ]
    assert second.startswith("[c-2] [rank 2 of 2]")


async def test_E6_the_search_is_scoped_to_the_document_filter_and_expanded(corpus):
    deps = Deps(state={"passages": {"document_filter": "d-2"}})
    await run(corpus, [respond(ps("masks")), respond("a")], deps)
    assert ("search", ("masks", 5, "d-2")) in corpus.calls
    assert corpus.count("expand_context") == 1
    assert {r.document_id for r in state(deps).working_set["masks"]} == {"d-2"}
    assert state(deps).document_filter == "d-2"


# --- E15 pictures on results -------------------------------------------------------------------


async def test_E15_with_vision_result_pictures_follow_the_returns_as_verified_pairs(corpus):
    corpus.results_for["fig"] = ["c-1", "c-6"]
    model = await run(corpus, [respond(ps("fig")), respond("a")], vision=True)
    request = model.wire(2)[-1]
    assert isinstance(request, ModelRequest)
    content = [p for p in request.parts if isinstance(p, UserPromptPart)][0].content
    assert len(content) == 2
    label, image = content
    assert label.startswith("Knowledge-base picture 1/1, attached with result [c-1] (#/pictures/0)")
    assert image == BinaryContent(data=PNG, media_type="image/png")
    assert is_our_picture(SIGNER, label, image)


async def test_E15_without_vision_no_pictures_are_attached(corpus):
    model = await run(corpus, [respond(ps("masks")), respond("a")])
    assert not any(isinstance(p, UserPromptPart) for p in model.wire(2)[-1].parts)


async def test_E15_R22_only_undecodable_pictures_attach_nothing(corpus):
    corpus.results_for["broken"] = ["c-6"]
    model = await run(corpus, [respond(ps("broken")), respond("a")], vision=True)
    assert not any(isinstance(p, UserPromptPart) for p in model.wire(2)[-1].parts)


# --- E16 get_picture_bytes ---------------------------------------------------------------------


async def test_E16_picture_bytes_come_through_the_run_store_unchanged_and_uncached(corpus, deps):
    capability = create_passages(corpus, SIGNER)
    ctx = RunContext(deps=deps, model=ScriptedModel([]), usage=RunUsage(), messages=[], prompt="q")
    owner = await capability.for_run(ctx)
    assert await owner.get_picture_bytes("d-1", "#/pictures/0") == PNG
    assert corpus.calls == [("get_picture_bytes", ("d-1", "#/pictures/0"))]
    assert await owner.get_picture_bytes("d-1", "#/pictures/9") is None
    owner.sync()
    assert "iVBOR" not in str(deps.state)


# --- E10 citing --------------------------------------------------------------------------------


def add_uuid_chunk(corpus: FakeCorpus) -> None:
    corpus.add_chunk(Chunk(id=UUID, document_id="d-1", content="Figure 3-1 shows the mask fitting."))
    corpus.results_for["fig"] = [UUID]


async def test_E10a_R24_damaged_uuids_are_repaired_against_this_questions_results(corpus, deps):
    add_uuid_chunk(corpus)
    turns = [
        respond(ps("fig")),
        respond(pc(UUID[:-1], call_id="pc1")),
        respond(pc(UUID.split("-", 1)[1], call_id="pc2")),
        respond(pc(UNRELATED, call_id="pc3")),
        respond("a"),
    ]
    model = await run(corpus, turns, deps)
    assert returns(model, 3)[-1] == cite_ack(1)
    assert returns(model, 4)[-1] == cite_ack(1)
    unrelated = tool_returns(model.wire(5))[-1]
    assert unrelated.outcome == "retried" and UNRELATED in unrelated.content
    assert unrelated.content == no_citation_message([UNRELATED])
    assert state(deps).citations == [UUID]
    assert list(state(deps).citation_index) == [UUID]
    assert [args for name, args in corpus.calls if name == "get_chunk"] == [(UNRELATED,)]


async def test_E10b_R23_a_partial_citation_acknowledges_and_does_not_invite_another_call(corpus, deps):
    model = await run(corpus, [respond(ps("topic1")), respond(pc("c-1", "6.43", "6.51.2")), respond("a")], deps)
    ack = returns(model, 3)[-1]
    assert ack == cite_ack(1, ["6.43", "6.51.2"])
    assert "6.43" in ack and "6.51.2" in ack
    assert "again" not in ack.lower() and "retry" not in ack.lower()
    assert tool_returns(model.wire(3))[-1].outcome == "success"


async def test_E10c_an_empty_cite_is_an_explicit_ungrounded_declaration(corpus, deps):
    model = await run(corpus, [respond(ps("topic1")), respond(pc()), respond("a")], deps)
    assert returns(model, 3)[-1] == CITE_NONE_ACK
    assert citation_status([record(deps)], question=0) == "ungrounded"
    assert state(deps).citations == []


async def test_E10d_an_empty_cite_after_a_grounding_keeps_it(corpus, deps):
    turns = [respond(ps("topic1")), respond(pc("c-1")), respond(pc(call_id="pc2")), respond("a")]
    await run(corpus, turns, deps)
    assert citation_status([record(deps)], question=0) == "grounded"
    assert record(deps).declaration is not None and record(deps).declaration.epoch == 5


async def test_E10e_a_store_chunk_never_retrieved_in_this_question_grounds_without_provenance(corpus, deps):
    model = await run(corpus, [respond(ps("topic1")), respond(pc("c-7")), respond("a")], deps)
    assert returns(model, 3)[-1] == cite_ack(1)
    assert citation_status([record(deps)], question=0) == "grounded"
    occurrence = record(deps).occurrences["c-7"]
    assert (occurrence.retrieved_in_questions, occurrence.cited_in_questions) == ([], [0])
    assert state(deps).citation_index["c-7"].document_id == "d-2"


async def test_E10_bracketed_ids_are_normalised(corpus, deps):
    model = await run(corpus, [respond(ps("topic1")), respond(pc("[c-1]", " c-1 ")), respond("a")], deps)
    assert returns(model, 3)[-1] == cite_ack(1)
    assert state(deps).citations == ["c-1"]
    assert record(deps).occurrences["c-1"].retrieved_in_questions == [0]


async def test_E10_nothing_resolvable_records_no_declaration(corpus, deps):
    model = await run(corpus, [respond(ps("topic1")), respond(pc("nope")), respond("a")], deps)
    assert tool_returns(model.wire(3))[-1].outcome == "retried"
    assert record(deps).declaration is None
    assert state(deps).citation_index == {}


# --- E11 registration --------------------------------------------------------------------------


async def test_E11_citations_are_numbered_with_one_document_lookup_and_metadata_copied(corpus, deps):
    model = await run(corpus, [respond(pc("c-1", "c-2")), respond("a")], deps)
    assert returns(model, 2) == [cite_ack(2)]
    index = state(deps).citation_index
    assert [(c.chunk_id, c.index) for c in index.values()] == [("c-1", 1), ("c-2", 2)]
    assert corpus.count("get_document") == 1
    assert index["c-1"].document_meta == {"lang": "en"}
    assert index["c-1"].picture_refs == ["#/pictures/0"]


async def test_E11_numbering_runs_across_the_conversation(corpus, deps):
    capability = create_passages(corpus, SIGNER)
    agent = Agent(ScriptedModel([respond(pc("c-1")), respond("a1"), respond(pc("c-3", "c-1", call_id="pc2")),
                                 respond("a2")]), capabilities=[capability], deps_type=Deps)
    first = await agent.run("q1", deps=deps)
    await agent.run("q2", message_history=first.all_messages(), deps=deps)
    assert {k: c.index for k, c in state(deps).citation_index.items()} == {"c-1": 1, "c-3": 2}
    assert state(deps).citations == ["c-3", "c-1"]


class ExpandingCorpus(FakeCorpus):
    """Context expansion merges each hit with the next chunk of its document."""

    async def expand_context(self, results: list[RetrievedChunk]) -> list[RetrievedChunk]:
        out = []
        for r in results:
            nxt = f"c-{int(r.chunk_id.split('-')[1]) + 1}"
            out.append(r.model_copy(update={"chunk_ids": [r.chunk_id, nxt],
                                            "content": r.content + "\n" + self.chunks[nxt].content}))
        return out


async def test_E11_a_constituent_of_an_expanded_result_cites_with_the_text_the_model_saw(deps):
    corpus = ExpandingCorpus()
    await run(corpus, [respond(ps("topic1")), respond(pc("c-2")), respond("a")], deps)
    citation = state(deps).citation_index["c-2"]
    assert citation.content == "chunk 1 content about topic1 and masks\nchunk 2 content about topic2 and masks"
    assert citation.chunk_ids == ["c-1", "c-2"]
    assert record(deps).occurrences["c-2"].retrieved_in_questions == [0]
    assert corpus.count("get_chunk") == 0


# --- L10(d) / R31 ------------------------------------------------------------------------------


async def test_L10d_R31_a_cite_in_the_same_response_as_its_search_is_not_current(corpus, deps):
    await run(corpus, [respond(ps("masks", "c1"), pc("c-1", call_id="c2")), respond("a")], deps)
    assert record(deps).latest_evidence_epoch == 1 and record(deps).declaration.epoch == 1
    assert citation_status([record(deps)], question=0) == "missing"


# --- E12-E14 request limit, grace, withdrawal, notices -----------------------------------------


async def test_E12a_at_the_request_limit_only_cite_stays_offered_with_a_notice(corpus):
    model = await run(corpus, [respond(ps("masks")), respond("a")], None, create_reader(corpus, SIGNER),
                      request_limit=1)
    assert {"passages_search", "passages_cite"} <= model.offered(1)
    assert "passages_search" not in model.offered(2)
    assert {"passages_cite", "reader_read", "reader_list_documents", "reader_cite", "host"} <= model.offered(2)
    notice = request_limit_notice("passages", "passages_cite")
    assert notice not in model.instructions(1)
    assert notice in model.instructions(2)
    assert "request limit" in notice and "passages_cite" in notice


async def test_E12b_R29_the_cite_grace_window_is_bounded(corpus):
    turns = [respond(call("host", {}, "h1")), respond(pc(call_id="pc1")), respond(pc(call_id="pc2")),
             respond(pc(call_id="pc3")), respond("a")]
    model = await run(corpus, turns, None, request_limit=1)
    assert [("passages_cite" in model.offered(k)) for k in range(1, 6)] == [True, True, True, True, False]
    assert "passages_search" not in model.offered(5) and "host" in model.offered(5)
    assert withdrawn_notice("passages") in model.instructions(5)
    assert "passages_cite" not in withdrawn_notice("passages") and "withdrawn" in withdrawn_notice("passages")


async def test_E12c_R30_other_tools_after_the_limit_do_not_spend_grace(corpus):
    turns = [respond(call("host", {}, "h1")), respond(call("host", {}, "h2")),
             respond(call("reader_list_documents", {}, "rl")), respond(call("host", {}, "h3")), respond("a")]
    model = await run(corpus, turns, None, create_reader(corpus, SIGNER), request_limit=1)
    assert all("passages_cite" in model.offered(k) for k in range(2, 6))
    assert request_limit_notice("passages", "passages_cite") in model.instructions(5)


def test_E12d_R30_only_the_most_recent_response_counts_as_calling_our_tools():
    names = {"passages_search", "passages_cite"}
    user = ModelRequest(parts=[UserPromptPart("q")])
    assert not called_own_tool([user], names)
    assert not called_own_tool([user, respond(call("reader_read", {}))], names)
    assert called_own_tool([user, respond(pc())], names)
    assert not called_own_tool([respond(pc()), user, respond(call("reader_read", {}))], names)
    assert not called_own_tool([user, ModelResponse(parts=[TextPart("a")])], names)


def test_E12_cite_available_until_the_grace_requests_are_used(corpus):
    capability = create_passages(corpus, SIGNER)
    assert capability.cite_available
    assert replace(capability, grace_requests_used=GRACE_REQUESTS - 1).cite_available
    assert not replace(capability, grace_requests_used=GRACE_REQUESTS).cite_available


async def test_E13_R27_a_spent_search_stays_declared_with_a_notice(corpus, deps):
    turns = [respond(ps("masks")), respond(ps("topic2", "ps2")), respond("answered")]
    model = await run(corpus, turns, deps, max_searches=1)
    assert {"passages_search", "passages_cite"} <= model.offered(2)
    assert exhausted_notice(["passages_search"], [], "passages_cite") in model.instructions(2)
    assert "passages_search is exhausted" in model.instructions(2)
    assert tool_returns(model.wire(3))[-1].outcome == "failed"
    assert list(state(deps).working_set) == ["masks"]


def test_E14_R28_notices_follow_the_counters_and_never_name_a_withdrawn_tool(corpus):
    capability = create_passages(corpus, SIGNER, request_limit=2)
    assert capability.budget_notice() is None
    at_limit = replace(capability, request_count=2)
    assert at_limit.budget_notice() == request_limit_notice("passages", "passages_cite")
    assert "passages_cite" in at_limit.budget_notice()
    expired = replace(capability, request_count=5, grace_requests_used=2)
    assert "passages_cite" not in expired.budget_notice() and "withdrawn" in expired.budget_notice()
    spent = replace(capability, uses={"passages_search": 5})
    assert spent.budget_notice() == exhausted_notice(["passages_search"], [], "passages_cite")
    unlimited = replace(create_passages(corpus, SIGNER, request_limit=None), request_count=1000)
    assert unlimited.budget_notice() is None


def test_E9_passages_evidence_tools_never_include_cite(corpus):
    capability = create_passages(corpus, SIGNER)
    assert capability.evidence_tool_names() == frozenset({"passages_search"})
    assert capability.cite_tool_name == "passages_cite"
    assert capability.id == "evidence-passages" and capability.namespace == "passages"
    assert isinstance(PassagesState(), EvidenceState)
