"""Part C, EvidenceCompactionCapability: the pure rewrite first, then scenarios on the wire."""

from __future__ import annotations

import copy
import dataclasses
import re

import pytest
from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    UserError,
)
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

import capabilities.compaction as compaction
from capabilities.capsule import CAPSULE_HEADER, build_capsule, group_label
from capabilities.citing import cite_ack
from capabilities.compaction import (
    COMPACTOR_ID,
    RECEIPT,
    EvidenceCompactionCapability,
    compact_history,
    create_compactor,
)
from capabilities.corpus import SQLiteCorpus, ingest
from capabilities.evidence import DISAGREEING_QUESTIONS
from capabilities.passages import create_passages
from capabilities.reader import create_reader
from capabilities.tags import TagSigner, picture_label
from tests.harness import (
    FIXTURES,
    NOT_AN_IMAGE,
    OTHER_PNG,
    PNG,
    SIGNER,
    Deps,
    FakeCorpus,
    ScriptedModel,
    pc,
    ps,
    respond,
    tool_returns,
)

OWNED = frozenset({"passages_search", "reader_list_documents", "reader_read"})


def image(data: bytes = PNG) -> BinaryContent:
    return BinaryContent(data=data, media_type="image/png")


def our_label(chunk_id: str = "c-1", data: bytes = PNG, *, capability: str = "passages", ref: str = "#/pictures/0"):
    return picture_label(
        SIGNER, capability=capability, document_id="d-1", self_ref=ref, chunk_id=chunk_id, image=data, position=(1, 1)
    )


def our_pair(chunk_id: str = "c-1", data: bytes = PNG, **kw) -> list:
    return [our_label(chunk_id, data, **kw), image(data)]


def U(content) -> ModelRequest:
    return ModelRequest(parts=[UserPromptPart(content=content)])


def M(*parts) -> ModelResponse:
    return ModelResponse(parts=[TextPart(p) if isinstance(p, str) else p for p in parts])


def ps_call(call_id: str) -> ToolCallPart:
    return ToolCallPart(tool_name="passages_search", args={"query": "q"}, tool_call_id=call_id)


def T(*returns: tuple[str, str, str], extra: list | None = None, outcome: str = "success") -> ModelRequest:
    parts = [
        ToolReturnPart(tool_name=name, content=content, tool_call_id=cid, outcome=outcome)
        for name, cid, content in returns
    ]
    return ModelRequest(parts=[*parts, *(extra or [])])


def question(opening: str, evidence: str, call_id: str, *, extra: list | None = None) -> list[ModelMessage]:
    """`[i] U [i+1] M ps#id [i+2] T ps#id = evidence [i+3] M "a"`."""
    return [U(opening), M(ps_call(call_id)), T(("passages_search", call_id, evidence), extra=extra), M("a")]


def compact(messages, *, boundary, capsule_text="", capsule_images=(), signer=SIGNER, owned=OWNED):
    return compact_history(
        messages,
        boundary=boundary,
        owned=owned,
        capsule_text=capsule_text,
        capsule_images=list(capsule_images),
        signer=signer,
    )


def return_contents(messages) -> list:
    return [p.content for p in tool_returns(messages)]


def items(messages) -> list:
    """Every item of every list-content UserPromptPart, in order."""
    out = []
    for m in messages:
        if isinstance(m, ModelRequest):
            for p in m.parts:
                if isinstance(p, UserPromptPart) and not isinstance(p.content, str):
                    out += list(p.content)
    return out


# --- C7: one carrier, receipts elsewhere -----------------------------------------------------------


def test_C7a_the_only_earlier_return_carries_the_capsule():
    assert return_contents(compact(question("q0", "EVIDENCE", "c1"), boundary=4, capsule_text="CAPSULE")) == ["CAPSULE"]


def test_C7b_the_newest_earlier_return_carries_it_and_older_ones_get_receipts():
    messages = question("q0", "OLD", "c1") + question("q4", "NEWER", "c2")
    assert return_contents(compact(messages, boundary=8, capsule_text="CAPSULE")) == [RECEIPT, "CAPSULE"]


def test_C7c_R3b_R33_two_returns_in_one_request_get_one_capsule():
    messages = [
        U("q0"),
        M(ps_call("c1"), ps_call("c2")),
        T(("passages_search", "c1", "FIRST"), ("passages_search", "c2", "SECOND")),
        M("a"),
    ]
    compacted = compact(messages, boundary=4, capsule_text="CAPSULE")
    assert return_contents(compacted) == [RECEIPT, "CAPSULE"]
    assert [p.tool_call_id for p in tool_returns(compacted)] == ["c1", "c2"]


def test_C7d_nothing_cited_leaves_a_receipt():
    assert return_contents(compact(question("q0", "EVIDENCE", "c1"), boundary=4, capsule_text="")) == [RECEIPT]


def test_C3_messages_at_or_above_the_boundary_pass_through_as_the_same_objects():
    messages = question("q0", "OLD", "c1") + question("q4", "LIVE", "c2")
    compacted = compact(messages, boundary=4, capsule_text="CAPSULE")
    assert return_contents(compacted) == ["CAPSULE", "LIVE"]
    assert all(compacted[i] is messages[i] for i in range(4, 8))


# --- C4: only owned returns ------------------------------------------------------------------------


def test_C4_other_tools_and_cite_acknowledgements_are_untouched():
    messages = [
        U("q0"),
        M(ToolCallPart("other_tool", {}, "o1"), ToolCallPart("passages_cite", {"chunk_ids": ["c-1"]}, "p1")),
        T(("other_tool", "o1", "NOT OURS"), ("passages_cite", "p1", cite_ack(1))),
        M("a"),
    ]
    compacted = compact(messages, boundary=4, capsule_text="CAPSULE")
    assert return_contents(compacted) == ["NOT OURS", cite_ack(1)]
    assert compacted[2] is messages[2]


def test_C4_owned_returns_are_rewritten_whatever_their_outcome():
    messages = [
        U("q0"),
        M(ps_call("c1")),
        T(("passages_search", "c1", "Search limit reached."), outcome="failed"),
        M(ps_call("c2")),
        T(("reader_read", "c2", "bad args"), outcome="retried"),
        M("a"),
    ]
    compacted = compact(messages, boundary=6, capsule_text="CAPSULE")
    assert return_contents(compacted) == [RECEIPT, "CAPSULE"]
    assert [p.outcome for p in tool_returns(compacted)] == ["failed", "retried"]


# --- C8, C9: pictures below the boundary ----------------------------------------------------------


def test_C8a_our_picture_in_an_earlier_return_request_is_stripped():
    messages = question("q0", "EVIDENCE", "c1", extra=[UserPromptPart(content=our_pair())])
    compacted = compact(messages, boundary=4, capsule_text="CAPSULE")
    assert items(compacted) == []
    assert [type(p) for p in compacted[2].parts] == [ToolReturnPart]


def test_C8b_a_users_picture_is_kept():
    messages = [U(["look at this", image()]), M("a")]
    compacted = compact(messages, boundary=2)
    assert items(compacted) == ["look at this", image()]
    assert compacted[0] is messages[0]


def test_C8c_R2_our_wording_without_a_tag_keeps_text_and_picture():
    messages = [U(["This figure is from the knowledge base, attached for my report", image()]), M("a")]
    compacted = compact(messages, boundary=2)
    assert items(compacted) == ["This figure is from the knowledge base, attached for my report", image()]
    assert all(m.parts for m in compacted)


def test_R2_our_exact_label_above_a_different_image_is_kept():
    messages = [U(["see", our_label("c-1", PNG), image(OTHER_PNG)]), M("a")]
    compacted = compact(messages, boundary=2)
    assert items(compacted) == ["see", our_label("c-1", PNG), image(OTHER_PNG)]


def test_C8d_a_label_followed_by_text_is_not_a_pair():
    messages = [U([our_label(), "and more"]), M("a")]
    assert items(compact(messages, boundary=2)) == [our_label(), "and more"]


def test_C8_only_verified_pairs_go_and_everything_else_keeps_its_order():
    messages = [U(["before", *our_pair(), "between", image(OTHER_PNG), *our_pair("c-2"), "after"]), M("a")]
    compacted = compact(messages, boundary=2)
    assert items(compacted) == ["before", "between", image(OTHER_PNG), "after"]
    assert isinstance(compacted[0].parts[0], UserPromptPart)


def test_C8_str_prompts_are_kept():
    messages = [U("plain question"), M("a")]
    assert compact(messages, boundary=2)[0] is messages[0]


def test_R3a_pictures_of_two_tools_after_their_returns_are_recognised_by_signature_not_position():
    messages = [
        U("q0"),
        M(ps_call("c1"), ToolCallPart("reader_read", {"document_id": "d-1"}, "r1")),
        T(
            ("passages_search", "c1", "SEARCH"),
            ("reader_read", "r1", "READ"),
            extra=[
                UserPromptPart(content=our_pair("c-1")),
                UserPromptPart(content=["user note", image(OTHER_PNG)]),
                UserPromptPart(content=our_pair("c-2", OTHER_PNG, capability="reader", ref="#/pictures/3")),
            ],
        ),
        M("a"),
    ]
    compacted = compact(messages, boundary=4, capsule_text="CAPSULE")
    assert return_contents(compacted) == [RECEIPT, "CAPSULE"]
    assert items(compacted) == ["user note", image(OTHER_PNG)]
    assert len(compacted[2].parts) == 3


def test_T5_pictures_that_no_longer_verify_stay_on_the_wire():
    messages = question("q0", "EVIDENCE", "c1", extra=[UserPromptPart(content=our_pair())])
    compacted = compact(messages, boundary=4, capsule_text="CAPSULE", signer=TagSigner([b"rotated-key"]))
    assert items(compacted) == our_pair()


def test_C9_R39_a_request_stripping_would_empty_is_kept_unchanged():
    messages = [U(our_pair()), M("a")]
    compacted = compact(messages, boundary=2)
    assert compacted[0] is messages[0]
    assert all(m.parts for m in compacted)


def test_C9_C2_only_changed_messages_are_replaced_by_copies_and_originals_stay_intact():
    messages = question("q0", "EVIDENCE", "c1", extra=[UserPromptPart(content=our_pair())]) + question(
        "q4", "LIVE", "c2"
    )
    snapshot = [copy.deepcopy(list(m.parts)) for m in messages]
    compacted = compact(messages, boundary=4, capsule_text="CAPSULE", capsule_images=our_pair("c-1"))
    assert [list(m.parts) for m in messages] == snapshot
    assert compacted[2] is not messages[2]
    assert [i for i, (a, b) in enumerate(zip(compacted, messages)) if a is not b] == [2]


# --- C11 (pure half): where re-attached pictures go ----------------------------------------------


def test_C11_capsule_pictures_form_one_new_part_at_the_end_of_the_carriers_request():
    retained = ["cited label", image()]
    messages = question("q0", "OLD", "c1") + question("q4", "NEWER", "c2", extra=[UserPromptPart(content=our_pair())])
    compacted = compact(messages, boundary=8, capsule_text="CAPSULE", capsule_images=retained)
    carrier_request = compacted[6]
    assert [type(p) for p in carrier_request.parts] == [ToolReturnPart, UserPromptPart]
    assert carrier_request.parts[0].content == "CAPSULE"
    assert carrier_request.parts[-1].content == retained
    assert items(compacted) == retained


def test_C11_with_no_carrier_nothing_is_attached():
    messages = [U("q0"), M("a"), U("q2"), M("b")]
    compacted = compact(messages, boundary=4, capsule_text="CAPSULE", capsule_images=["cited label", image()])
    assert items(compacted) == []
    assert all(a is b for a, b in zip(compacted, messages))


# --- Scenarios: real agents, ScriptedModel, the exact wire per request ----------------------------

def settled(namespace: str = "passages", question: int = 0) -> dict:
    """A carried record whose question `question` has finished."""
    return {namespace: {"evidence": {"question": question, "in_progress": False}}}


def agent_for(model, *capabilities, output_type=str) -> Agent:
    return Agent(model, capabilities=list(capabilities), deps_type=Deps, output_type=output_type)


def wire_items(model: ScriptedModel, k: int) -> list:
    return items(model.wire(k))


@pytest.fixture
def corpus() -> FakeCorpus:
    corpus = FakeCorpus()
    corpus.results_for["figure"] = ["c-1"]
    corpus.results_for["guide"] = ["c-7"]
    return corpus


async def test_C1_without_the_compactor_earlier_evidence_is_sent_as_stored(corpus):
    model = ScriptedModel([respond("b")])
    history = question("q0", "EVIDENCE", "c1")
    await agent_for(model, create_passages(corpus, SIGNER)).run("q1", message_history=history, deps=Deps(settled()))
    assert return_contents(model.wire(1)) == ["EVIDENCE"]


async def test_C1_with_the_compactor_earlier_evidence_becomes_a_receipt(corpus):
    model = ScriptedModel([respond("b")])
    history = question("q0", "EVIDENCE", "c1")
    agent = agent_for(model, create_passages(corpus, SIGNER), create_compactor(SIGNER))
    await agent.run("q1", message_history=history, deps=Deps(settled()))
    assert return_contents(model.wire(1)) == [RECEIPT]


async def test_C2_stored_history_keeps_the_real_evidence(corpus):
    model = ScriptedModel([respond("b")])
    history = question("q0", "REAL EVIDENCE", "c1")
    snapshot = copy.deepcopy(history)
    agent = agent_for(model, create_passages(corpus, SIGNER), create_compactor(SIGNER))
    result = await agent.run("q1", message_history=history, deps=Deps(settled()))
    assert return_contents(model.wire(1)) == [RECEIPT]
    assert return_contents(result.all_messages()) == ["REAL EVIDENCE"]
    assert RECEIPT not in str(result.all_messages())
    assert history == snapshot


RESUME_SHAPES = {  # F2: a promptless run sends the trailing request; deferred results append one
    "promptless": ({}, 8),
    "deferred-tool-results": ({"deferred_tool_results": DeferredToolResults()}, 9),
}


@pytest.mark.parametrize("shape", list(RESUME_SHAPES))
async def test_C3_R4_a_resumption_compacts_below_the_question_in_progress(corpus, shape):
    history = question("q0", "EVIDENCE FOR THE OLD TURN", "c1")[:4] + [
        U("q4"),
        M(ps_call("c2")),
        T(("passages_search", "c2", "EVIDENCE FOR THE LIVE TURN")),
    ]
    model = ScriptedModel([respond("answer")])
    agent = agent_for(
        model, create_passages(corpus, SIGNER), create_compactor(SIGNER), output_type=[str, DeferredToolRequests]
    )
    deps = Deps({"passages": {"evidence": {"question": 4, "in_progress": True}}})
    run_kwargs, stored = RESUME_SHAPES[shape]
    result = await agent.run(message_history=history, deps=deps, **run_kwargs)
    assert len(result.all_messages()) == stored
    assert return_contents(model.wire(1)) == [RECEIPT, "EVIDENCE FOR THE LIVE TURN"]
    assert result.output == "answer"
    assert deps.state["passages"]["evidence"]["question"] == 4


def test_R4_both_resume_shapes_are_collected(request):
    """R4: the resume cases once stopped running silently; count what pytest actually collects."""
    resume_test = test_C3_R4_a_resumption_compacts_below_the_question_in_progress.__name__
    module = request.node.parent
    collected = [item.callspec.id for item in module.collect() if getattr(item, "originalname", None) == resume_test]
    assert sorted(collected) == ["deferred-tool-results", "promptless"]


async def test_C4_cite_acknowledgements_survive_on_the_wire(corpus):
    model = ScriptedModel([respond(ps("figure", "s1")), respond(pc("c-1", call_id="p1")), respond("a0"), respond("a1")])
    agent = agent_for(model, create_passages(corpus, SIGNER), create_compactor(SIGNER))
    deps = Deps()
    first = await agent.run("q0", deps=deps)
    await agent.run("q1", message_history=first.all_messages(), deps=deps)
    contents = return_contents(model.wire(4))
    assert contents[0].startswith(CAPSULE_HEADER)
    assert contents[1] == cite_ack(1)


async def test_C5_C7_later_questions_see_every_earlier_citation_newest_first(corpus):
    model = ScriptedModel(
        [
            respond(ps("figure", "s1")), respond(pc("c-1", call_id="p1")), respond("a0"),
            respond(ps("guide", "s2")), respond(pc("c-7", call_id="p2")), respond("a1"),
            respond("a2"),
        ]
    )  # fmt: skip
    agent = agent_for(model, create_passages(corpus, SIGNER), create_compactor(SIGNER))
    deps = Deps()
    first = await agent.run("q0", deps=deps)
    second = await agent.run("q1", message_history=first.all_messages(), deps=deps)
    await agent.run("q2", message_history=second.all_messages(), deps=deps)
    contents = return_contents(model.wire(7))
    assert contents[0] == RECEIPT and contents[1] == cite_ack(1) and contents[3] == cite_ack(1)
    capsule = contents[2]
    newest, oldest = capsule.index(group_label(1)), capsule.index(group_label(2))
    assert newest < capsule.index("[c-7]") < oldest < capsule.index("[c-1]")
    assert corpus.chunks["c-7"].content in capsule and corpus.chunks["c-1"].content in capsule


async def q0_cites_a_picture_then_q1_answers(corpus, *, vision=True, before_q1=lambda: None, compactor_signer=SIGNER):
    """C11's scenario: `[1] M ps` finds c-1 (with `#/pictures/0`), `[3] M pc[c-1]`, then Q1."""
    model = ScriptedModel([respond(ps("figure", "s1")), respond(pc("c-1", call_id="p1")), respond("a0"), respond("a1")])
    agent = agent_for(model, create_passages(corpus, SIGNER, vision=vision), create_compactor(compactor_signer))
    deps = Deps()
    first = await agent.run("q0", deps=deps)
    before_q1()
    second = await agent.run("q1", message_history=first.all_messages(), deps=deps)
    return model, first, second


CITED_LABEL = picture_label(
    SIGNER, capability="passages", document_id="d-1", self_ref="#/pictures/0", chunk_id="c-1", image=PNG, cited=True
)


async def test_C11a_a_cited_picture_is_reattached_once_in_the_carriers_request(corpus):
    model, first, _ = await q0_cites_a_picture_then_q1_answers(corpus)
    assert wire_items(model, 2) == [our_label("c-1"), image()]
    wire = model.wire(4)
    assert items(wire) == [CITED_LABEL, image()]
    carrier_request = wire[2]
    assert [type(p) for p in carrier_request.parts] == [ToolReturnPart, UserPromptPart]
    assert carrier_request.parts[0].content.startswith(CAPSULE_HEADER)
    assert carrier_request.parts[1].content == [CITED_LABEL, image()]
    assert items(first.all_messages()) == [our_label("c-1"), image()]


def picture_none(corpus: FakeCorpus) -> None:
    corpus.picture_mode = "none"


def picture_undecodable(corpus: FakeCorpus) -> None:
    corpus.pictures[("d-1", "#/pictures/0")] = NOT_AN_IMAGE


def picture_raises(corpus: FakeCorpus) -> None:
    corpus.picture_mode = "raise"


@pytest.mark.parametrize(
    "failure", [picture_none, picture_undecodable, picture_raises], ids=["none", "undecodable", "oserror"]
)
async def test_C11bcd_R21_a_failed_picture_costs_only_that_picture(corpus, failure):
    model, _, second = await q0_cites_a_picture_then_q1_answers(corpus, before_q1=lambda: failure(corpus))
    wire = model.wire(4)
    assert items(wire) == []
    assert CITED_LABEL not in str(wire)
    assert return_contents(wire)[0].startswith(CAPSULE_HEADER)
    assert corpus.count("get_picture_bytes") == 1
    assert second.output == "a1"


async def test_C10e_R36_no_pictures_reach_a_model_without_vision(corpus):
    model, _, _ = await q0_cites_a_picture_then_q1_answers(corpus, vision=False)
    assert items(model.wire(4)) == []
    assert return_contents(model.wire(4))[0].startswith(CAPSULE_HEADER)
    assert corpus.count("get_picture_bytes") == 0


async def test_T5_a_picture_signed_with_a_dropped_key_stays_and_the_run_answers(corpus):
    rotated = TagSigner([b"rotated-key"])
    model, _, second = await q0_cites_a_picture_then_q1_answers(corpus, compactor_signer=rotated)
    relabelled = picture_label(
        rotated,
        capability="passages",
        document_id="d-1",
        self_ref="#/pictures/0",
        chunk_id="c-1",
        image=PNG,
        cited=True,
    )
    assert items(model.wire(4)) == [our_label("c-1"), image(), relabelled, image()]
    assert second.output == "a1"


@dataclasses.dataclass
class WrapSpy(AbstractCapability[object]):
    """Keeps what the compactor's wrap_model_request saw, to call it again by hand (C12)."""

    seen: list = dataclasses.field(default_factory=list)

    async def wrap_model_request(self, ctx: RunContext, *, request_context, handler):
        self.seen.append((ctx, dataclasses.replace(request_context, messages=list(request_context.messages))))
        return await handler(request_context)


async def test_C12_the_capsule_is_built_once_per_request_step(corpus, monkeypatch):
    builds: list[int] = []

    def counting_build(found, *, boundary):
        builds.append(boundary)
        return build_capsule(found, boundary=boundary)

    monkeypatch.setattr(compaction, "build_capsule", counting_build)
    spy = WrapSpy(id="spy")
    registered = create_compactor(SIGNER)
    model = ScriptedModel([respond("b")])
    agent = agent_for(model, create_passages(corpus, SIGNER), registered, spy)
    await agent.run("q1", message_history=question("q0", "EVIDENCE", "c1"), deps=Deps(settled()))
    assert builds == [4]
    ctx, request_context = spy.seen[0]
    run_compactor = ctx.capabilities[COMPACTOR_ID]
    assert run_compactor is not registered and registered.prepared is None

    handled: list[list[ModelMessage]] = []

    async def handler(rc):
        handled.append(rc.messages)
        return respond("again")

    again = dataclasses.replace(request_context, messages=list(request_context.messages))
    await run_compactor.wrap_model_request(ctx, request_context=again, handler=handler)
    assert builds == [4]
    next_step = dataclasses.replace(request_context, messages=list(request_context.messages))
    await run_compactor.wrap_model_request(
        dataclasses.replace(ctx, run_step=ctx.run_step + 1), request_context=next_step, handler=handler
    )
    assert builds == [4, 4]
    assert [return_contents(m) for m in handled] == [[RECEIPT], [RECEIPT]]


async def test_C12_for_run_returns_a_copy_with_an_empty_cache():
    registered = create_compactor(SIGNER)
    run = await registered.for_run(None)  # type: ignore[arg-type]
    assert run is not registered and run.prepared == {} and registered.prepared is None


async def test_C13_the_compactor_alone_sends_the_history_untouched():
    model = ScriptedModel([respond("b")])
    history = question("q0", "EVIDENCE", "c1")
    result = await agent_for(model, create_compactor(SIGNER)).run("q1", message_history=history, deps=Deps())
    assert model.wire(1)[:4] == history
    assert return_contents(model.wire(1)) == ["EVIDENCE"]
    assert result.output == "b"


async def test_C14a_R18_earlier_evidence_without_a_carried_record_is_refused(corpus):
    model = ScriptedModel([respond("b")])
    agent = agent_for(model, create_passages(corpus, SIGNER), create_compactor(SIGNER))
    with pytest.raises(RuntimeError, match="carry") as raised:
        await agent.run("q1", message_history=question("q0", "EVIDENCE", "c1"), deps=Deps())
    assert "passages" in str(raised.value)
    assert model.wires == []


async def test_C14b_the_same_history_with_a_carried_record_is_compacted(corpus):
    model = ScriptedModel([respond("b")])
    agent = agent_for(model, create_passages(corpus, SIGNER), create_compactor(SIGNER))
    await agent.run("q1", message_history=question("q0", "EVIDENCE", "c1"), deps=Deps(settled()))
    assert return_contents(model.wire(1)) == [RECEIPT]


def reader_question() -> list[ModelMessage]:
    return [
        U("q0"),
        M(ToolCallPart("reader_read", {"document_id": "d-1"}, "r1")),
        T(("reader_read", "r1", "READER EVIDENCE")),
        M("a"),
    ]


async def test_C14c_R19_a_capability_whose_record_was_not_carried_is_named(corpus):
    model = ScriptedModel([respond("b")])
    agent = agent_for(model, create_passages(corpus, SIGNER), create_reader(corpus, SIGNER), create_compactor(SIGNER))
    with pytest.raises(RuntimeError, match="carry") as raised:
        await agent.run("q1", message_history=reader_question(), deps=Deps(settled("passages")))
    assert "'reader'" in str(raised.value) and "'passages'" not in str(raised.value)
    assert model.wires == []


async def test_C14d_R20_an_unused_capability_without_a_record_is_no_reason_to_refuse(corpus):
    model = ScriptedModel([respond("b")])
    agent = agent_for(model, create_passages(corpus, SIGNER), create_reader(corpus, SIGNER), create_compactor(SIGNER))
    result = await agent.run("q1", message_history=question("q0", "EVIDENCE", "c1"), deps=Deps(settled("passages")))
    assert return_contents(model.wire(1)) == [RECEIPT]
    assert result.output == "b"


def test_C16_R37_two_compactors_in_one_agent_are_refused():
    with pytest.raises(UserError, match=COMPACTOR_ID):
        Agent(ScriptedModel([]), capabilities=[create_compactor(SIGNER), create_compactor(SIGNER)])


def test_C16_the_compactor_is_registered_under_its_explicit_id():
    compactor = create_compactor(SIGNER)
    assert isinstance(compactor, EvidenceCompactionCapability)
    assert compactor.id == COMPACTOR_ID
    assert compactor.get_toolset() is None


async def test_L2_disagreeing_evidence_capabilities_fail_before_any_request(corpus):
    model = ScriptedModel([respond("b")])
    agent = agent_for(model, create_passages(corpus, SIGNER), create_reader(corpus, SIGNER), create_compactor(SIGNER))
    history = question("q0", "EVIDENCE", "c1") + [U("q4"), M("a4")]
    state = {
        "passages": {"evidence": {"question": 3, "in_progress": True}},
        "reader": {"evidence": {"question": 3, "in_progress": False}},
    }
    with pytest.raises(RuntimeError, match=DISAGREEING_QUESTIONS) as raised:
        await agent.run("q6", message_history=history, deps=Deps(state))
    assert "passages" in str(raised.value) and "reader" in str(raised.value)
    assert model.wires == []


async def test_C5_C11_end_to_end_over_an_ingested_sqlite_corpus(tmp_path):
    """A real corpus: the cited chunk comes back whole in the capsule, and its figure is fetched
    again through the owner's own store connection in the next run."""
    db = tmp_path / "corpus.sqlite"
    report = ingest(db, [FIXTURES / "corpus" / "handbook.md"])
    assert not report.failed and not report.warnings

    def cite_first_result(messages: list[ModelMessage], info) -> ModelResponse:
        shown = return_contents(messages[-1:])[0]
        return respond(pc(re.search(r"^\[([^\]]+)\]", shown, re.MULTILINE).group(1), call_id="p1"))

    model = ScriptedModel([respond(ps("brass refractor", "s1")), cite_first_result, respond("a0"), respond("a1")])
    agent = agent_for(model, create_passages(lambda: SQLiteCorpus(db), SIGNER, vision=True), create_compactor(SIGNER))
    deps = Deps()
    first = await agent.run("q0", deps=deps)
    second = await agent.run("q1", message_history=first.all_messages(), deps=deps)

    (citation,) = deps.state["passages"]["citation_index"].values()
    assert citation["picture_refs"] == ["#/pictures/0"]
    wire = model.wire(4)
    capsule = return_contents(wire)[0]
    assert capsule.startswith(CAPSULE_HEADER)
    assert f'[{citation["chunk_id"]}] Source: "Oakridge Observatory Handbook" ({citation["document_uri"]})' in capsule
    assert citation["content"] in capsule and "150 mm lens" in capsule
    label = picture_label(
        SIGNER,
        capability="passages",
        document_id=citation["document_id"],
        self_ref="#/pictures/0",
        chunk_id=citation["chunk_id"],
        image=PNG,
        cited=True,
    )
    assert items(wire) == [label, image(PNG)]
    stored = return_contents(second.all_messages())[0]
    assert CAPSULE_HEADER not in stored and citation["chunk_id"] in stored
    assert label not in str(second.all_messages()) and len(items(second.all_messages())) == 2
