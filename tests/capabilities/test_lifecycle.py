"""Question identity, per-run copies, resources, syncing and discovery (L1-L4, L6, L12-L15, E1-E3,
E17-E19 and the regressions they cover)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import (
    Agent,
    CallDeferred,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    UserError,
)
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RunUsage

from capabilities.base import EvidenceCapability
from capabilities.citing import cite_ack
from capabilities.evidence import (
    DISAGREEING_QUESTIONS,
    DiscoveredEvidence,
    discover_evidence,
    evidence_owner,
    question_in_progress,
)
from capabilities.ledger import CapabilityEvidenceRecord, citation_status
from capabilities.passages import PassagesState, create_passages
from capabilities.questions import NO_RECORDED_IDENTITY
from capabilities.reader import ReaderState, create_reader
from tests.harness import (
    PNG,
    SIGNER,
    Deps,
    FakeCorpus,
    ScriptedModel,
    StatelessDeps,
    call,
    pc,
    ps,
    respond,
    tool_returns,
)


def U(text: str) -> ModelRequest:
    return ModelRequest(parts=[UserPromptPart(text)])


def M(*parts: Any) -> ModelResponse:
    return respond(*parts)


def T(tool: str, call_id: str, content: str = "ok") -> ModelRequest:
    return ModelRequest(parts=[ToolReturnPart(tool_name=tool, content=content, tool_call_id=call_id)])


def record(deps: Deps, namespace: str = "passages") -> CapabilityEvidenceRecord:
    return CapabilityEvidenceRecord.model_validate(deps.state[namespace]["evidence"])


@dataclass
class Spy(AbstractCapability[Any]):
    """Stands in for the policy/compactor: discovers evidence in before_run, as they do (E17, L2)."""

    seen: list[list[DiscoveredEvidence]] = field(default_factory=list)
    questions: list[int] = field(default_factory=list)

    async def before_run(self, ctx: RunContext[Any]) -> None:
        found = discover_evidence(ctx)
        self.seen.append(found)
        self.questions.append(question_in_progress(found))


def deferring_agent(model, *capabilities) -> Agent:
    agent = Agent(model, capabilities=list(capabilities), deps_type=Deps, output_type=[str, DeferredToolRequests])

    @agent.tool_plain
    def ext() -> str:
        raise CallDeferred()

    return agent


# --- L1 identity at arrival --------------------------------------------------------------------


async def test_L1a_a_prompt_on_an_empty_history_is_question_0(corpus, deps):
    agent = Agent(ScriptedModel([respond("a")]), capabilities=[create_passages(corpus, SIGNER)], deps_type=Deps)
    await agent.run("q1", deps=deps)
    assert record(deps).question == 0


async def test_L1b_a_prompt_after_two_messages_is_question_2(corpus, deps):
    agent = Agent(ScriptedModel([respond("a")]), capabilities=[create_passages(corpus, SIGNER)], deps_type=Deps)
    await agent.run("q2", message_history=[U("q"), M("a")], deps=deps)
    assert record(deps).question == 2


async def test_L1c_R15_a_promptless_first_message_is_question_0_and_its_search_epoch_exceeds_it(corpus, deps):
    model = ScriptedModel([respond(ps("masks")), respond("a")])
    agent = Agent(model, capabilities=[create_passages(corpus, SIGNER)], deps_type=Deps)
    await agent.run(message_history=[U("what about masks?")], deps=deps)
    assert record(deps).question == 0
    assert record(deps).latest_evidence_epoch == 1
    assert record(deps).latest_evidence_epoch > record(deps).question


async def test_L1d_no_history_and_no_prompt_is_question_0(corpus, deps):
    agent = Agent(
        ScriptedModel([respond("a")]), instructions="Say hi.", capabilities=[create_passages(corpus, SIGNER)],
        deps_type=Deps,
    )
    await agent.run(deps=deps)
    assert record(deps).question == 0


async def test_L1e_a_promptless_history_ending_in_a_text_response_is_question_len(corpus, deps):
    agent = Agent(ScriptedModel([respond("a")]), capabilities=[create_passages(corpus, SIGNER)], deps_type=Deps)
    await agent.run(message_history=[U("q"), M("a")], deps=deps)
    assert record(deps).question == 2


# --- L2 / R45 agreement ------------------------------------------------------------------------


SIX_SETTLED = [U("a"), M("b"), U("c"), M("d"), U("e"), M("f")]


async def test_L2_capabilities_on_different_questions_fail_before_any_request(corpus):
    deps = Deps(state={
        "passages": {"evidence": {"question": 3, "in_progress": True}},
        "reader": {"evidence": {"question": 3, "in_progress": False}},
    })
    model = ScriptedModel([])
    agent = Agent(model, capabilities=[create_passages(corpus, SIGNER), create_reader(corpus, SIGNER), Spy()],
                  deps_type=Deps)
    with pytest.raises(RuntimeError, match=DISAGREEING_QUESTIONS) as raised:
        await agent.run("next", message_history=SIX_SETTLED, deps=deps)
    assert "passages=3" in str(raised.value) and "reader=6" in str(raised.value)
    assert model.wires == []


async def test_L2_R45_adding_a_capability_mid_question_is_a_loud_error(corpus):
    deps = Deps(state={"passages": {"evidence": {"question": 0, "in_progress": True, "latest_evidence_epoch": 1}}})
    history = [U("q"), M(ps("masks", "c1")), T("passages_search", "c1")]
    agent = Agent(ScriptedModel([]), capabilities=[create_passages(corpus, SIGNER), create_reader(corpus, SIGNER),
                                                   Spy()], deps_type=Deps)
    with pytest.raises(RuntimeError, match=DISAGREEING_QUESTIONS) as raised:
        await agent.run(message_history=history, deps=deps)
    assert "passages=0" in str(raised.value) and "reader=2" in str(raised.value)


def test_L2_question_in_progress_is_0_without_evidence_capabilities():
    assert question_in_progress([]) == 0


# --- L3 new question versus resumption ---------------------------------------------------------


class Answer(BaseModel):
    text: str


async def test_L3a_R14_a_question_after_a_structured_answer_gets_a_new_identity(corpus, deps):
    def final(call_id: str) -> ModelResponse:
        return respond(call("final_result", {"text": "x"}, call_id))

    agent = Agent(ScriptedModel([final("o1"), final("o2")]), capabilities=[create_passages(corpus, SIGNER)],
                  deps_type=Deps, output_type=Answer)
    first = await agent.run("q1", deps=deps)
    history = first.all_messages()
    assert isinstance(history[-1], ModelRequest)
    await agent.run("q2", message_history=history, deps=deps)
    assert record(deps).question == len(history) == 3
    assert record(deps).in_progress is False


async def test_L3b_a_record_in_progress_continues_its_question_with_its_working_set(corpus):
    kept = [r.model_dump(mode="json") for r in await corpus.search("topic1", limit=1, filter=None)]
    deps = Deps(state={"passages": {
        "evidence": {"question": 3, "in_progress": True, "latest_evidence_epoch": 5},
        "working_set": {"topic1": kept}, "citations": ["c-1"],
    }})
    history = [U("a"), M("b"), U("c"), U("q"), M(ps("topic1", "c1")), T("passages_search", "c1")]
    agent = Agent(ScriptedModel([respond("answer")]), capabilities=[create_passages(corpus, SIGNER)], deps_type=Deps)
    await agent.run(message_history=history, deps=deps)
    state = PassagesState.model_validate(deps.state["passages"])
    assert state.evidence.question == 3
    assert state.evidence.latest_evidence_epoch == 5
    assert [r.chunk_id for r in state.working_set["topic1"]] == ["c-1"]
    assert state.citations == ["c-1"]
    assert state.evidence.in_progress is False


async def test_L3_a_new_question_clears_citations_and_working_set_but_keeps_index_scope_and_occurrences(corpus, deps):
    model = ScriptedModel([respond(ps("topic1")), respond(pc("c-1")), respond("a1"), respond("a2")])
    agent = Agent(model, capabilities=[create_passages(corpus, SIGNER)], deps_type=Deps)
    deps.state["passages"] = {"document_filter": "d-1"}
    first = await agent.run("q1", deps=deps)
    await agent.run("q2", message_history=first.all_messages(), deps=deps)
    state = PassagesState.model_validate(deps.state["passages"])
    assert state.evidence.question == 6
    assert state.citations == [] and state.working_set == {}
    assert list(state.citation_index) == ["c-1"]
    assert state.document_filter == "d-1"
    assert state.evidence.occurrences["c-1"].cited_in_questions == [0]


# --- L4 epochs ---------------------------------------------------------------------------------


async def test_L4_outcomes_and_declarations_carry_the_epoch_of_the_request_that_issued_them(corpus, deps):
    model = ScriptedModel([respond(ps("masks", "c1")), respond(pc("c-1", call_id="c2")), respond("a")])
    agent = Agent(model, capabilities=[create_passages(corpus, SIGNER)], deps_type=Deps)
    await agent.run("q", deps=deps)
    assert record(deps).latest_evidence_epoch == 1
    assert record(deps).declaration is not None and record(deps).declaration.epoch == 3


async def test_L4_R44_a_tool_run_before_the_first_request_of_a_resumption_stamps_the_history_length(corpus):
    deps = Deps(state={"passages": {"evidence": {"question": 4, "in_progress": True, "latest_evidence_epoch": 5}}})
    history = [U("a"), M("b"), U("c"), M("d"), U("q"), M(ps("masks", "c1")), T("passages_search", "c1")]
    capability = create_passages(corpus, SIGNER)
    ctx = RunContext(deps=deps, model=ScriptedModel([]), usage=RunUsage(), messages=history, prompt=None)
    run = await capability.for_run(ctx)
    await run.search(ctx, "masks")
    assert run.evidence_record().latest_evidence_epoch == 7
    assert record(deps).question == 4


# --- L6 end_question ---------------------------------------------------------------------------


async def test_L6a_a_plain_answer_ends_the_question(corpus, deps):
    agent = Agent(ScriptedModel([respond("a")]), capabilities=[create_passages(corpus, SIGNER)], deps_type=Deps)
    await agent.run("q", deps=deps)
    assert record(deps).in_progress is False


async def test_L6b_a_paused_run_leaves_the_question_in_progress(corpus, deps):
    agent = deferring_agent(ScriptedModel([respond(call("ext", {}, "c9"))]), create_passages(corpus, SIGNER))
    result = await agent.run("q", deps=deps)
    assert isinstance(result.output, DeferredToolRequests)
    assert record(deps).in_progress is True


async def test_L6_a_failed_run_leaves_the_question_in_progress(corpus, deps):
    def fail(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise RuntimeError("model down")

    agent = Agent(ScriptedModel([fail]), capabilities=[create_passages(corpus, SIGNER)], deps_type=Deps)
    with pytest.raises(RuntimeError, match="model down"):
        await agent.run("q", deps=deps)
    assert record(deps).question == 0
    assert record(deps).in_progress is True


# --- L12 sync ----------------------------------------------------------------------------------


async def test_L12_evidence_before_a_failed_tool_reaches_the_host(corpus, deps):
    model = ScriptedModel([respond(ps("masks")), respond(call("reader_read", {"document_id": "d-404"}, "r1")),
                           respond("a")])
    agent = Agent(model, capabilities=[create_passages(corpus, SIGNER), create_reader(corpus, SIGNER)], deps_type=Deps)
    await agent.run("q", deps=deps)
    assert tool_returns(model.wire(3))[-1].outcome == "failed"
    assert PassagesState.model_validate(deps.state["passages"]).working_set["masks"]
    assert "reader" in deps.state


async def test_L12_each_tool_call_syncs_even_when_the_run_then_fails(corpus, deps):
    def fail(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise RuntimeError("model down")

    agent = Agent(ScriptedModel([respond(ps("masks")), fail]), capabilities=[create_passages(corpus, SIGNER)],
                  deps_type=Deps)
    with pytest.raises(RuntimeError, match="model down"):
        await agent.run("q", deps=deps)
    state = PassagesState.model_validate(deps.state["passages"])
    assert [r.chunk_id for r in state.working_set["masks"]][:1] == ["c-1"]
    assert state.evidence.latest_evidence_epoch == 1


async def test_L12_the_identity_is_published_by_for_run(corpus, deps):
    capability = create_passages(corpus, SIGNER)
    ctx = RunContext(deps=deps, model=ScriptedModel([]), usage=RunUsage(), messages=[U("q"), M("a")], prompt="q2")
    await capability.for_run(ctx)
    assert record(deps).question == 2 and record(deps).in_progress is True


# --- L13/L14 carried state, R13 ----------------------------------------------------------------


async def test_L13_R13_a_host_seeded_default_record_cannot_pass_for_a_resumption(corpus):
    deps = Deps(state={"passages": PassagesState().model_dump()})
    agent = Agent(ScriptedModel([]), capabilities=[create_passages(corpus, SIGNER)], deps_type=Deps)
    with pytest.raises(RuntimeError, match=NO_RECORDED_IDENTITY):
        await agent.run(message_history=[U("q"), M(ps("masks", "c1"))], deps=deps)


async def test_L13_a_host_seeded_default_record_is_not_carried(corpus):
    deps = Deps(state={"passages": PassagesState().model_dump()})
    spy = Spy()
    agent = Agent(ScriptedModel([respond("a")]), capabilities=[create_passages(corpus, SIGNER), spy], deps_type=Deps)
    await agent.run("q2", message_history=[U("q"), M("a")], deps=deps)
    assert [f.state_carried for f in spy.seen[0]] == [False]


async def test_L13_a_record_from_an_earlier_question_is_carried(corpus, deps):
    spy = Spy()
    agent = Agent(ScriptedModel([respond("a1"), respond("a2")]), capabilities=[create_passages(corpus, SIGNER), spy],
                  deps_type=Deps)
    first = await agent.run("q1", deps=deps)
    await agent.run("q2", message_history=first.all_messages(), deps=deps)
    assert [[f.state_carried for f in found] for found in spy.seen] == [[False], [True]]


HISTORY_AWAITING_EXT = [U("q"), M(ps("masks", "c1")), T("passages_search", "c1"), M(call("ext", {}, "c9"))]


async def test_L14_a_resumption_without_a_recorded_identity_fails(corpus, deps):
    agent = deferring_agent(ScriptedModel([respond("a")]), create_passages(corpus, SIGNER))
    with pytest.raises(RuntimeError, match=NO_RECORDED_IDENTITY) as raised:
        await agent.run(message_history=HISTORY_AWAITING_EXT, deps=deps,
                        deferred_tool_results=DeferredToolResults(calls={"c9": "r"}))
    assert "passages" in str(raised.value)


async def test_L14_a_resumption_with_its_recorded_identity_continues(corpus):
    deps = Deps(state={"passages": {"evidence": {"question": 0, "in_progress": True, "latest_evidence_epoch": 1}}})
    agent = deferring_agent(ScriptedModel([respond("a")]), create_passages(corpus, SIGNER))
    result = await agent.run(message_history=HISTORY_AWAITING_EXT, deps=deps,
                             deferred_tool_results=DeferredToolResults(calls={"c9": "r"}))
    assert result.output == "a"
    assert record(deps).question == 0 and record(deps).in_progress is False


@pytest.mark.parametrize(
    "last",
    [
        ModelRequest(parts=[ToolReturnPart(tool_name="ext", content="retry", tool_call_id="x", outcome="retried")]),
        M(call("passages_search", {"query": "q"}, "x")),
    ],
    ids=["retried-return", "pending-call"],
)
def test_L14_awaits_model_recognises_unmistakable_resumptions(last):
    from capabilities.questions import awaits_model

    assert awaits_model([U("q"), last])
    assert not awaits_model([U("q"), M("a")])
    assert not awaits_model([U("q"), M(call("final_result", {}, "o")), T("final_result", "o")])


# --- L15 / R16 ---------------------------------------------------------------------------------


async def test_L15_a_stateless_host_answers_a_single_question_with_both_capabilities(corpus):
    model = ScriptedModel([
        respond(ps("masks")),
        respond(call("reader_read", {"document_id": "d-1", "page": 2}, "r1")),
        respond(pc("c-1"), call("reader_cite", {"chunk_ids": ["c-2"]}, "rc1")),
        respond("answer"),
    ])
    agent = Agent(model, capabilities=[create_passages(corpus, SIGNER), create_reader(corpus, SIGNER)],
                  deps_type=StatelessDeps)
    result = await agent.run("q", deps=StatelessDeps())
    assert result.output == "answer"
    assert [r.content for r in tool_returns(model.wire(4))[-2:]] == [cite_ack(1), cite_ack(1)]


async def test_R16_a_resumed_question_cites_what_the_paused_run_retrieved(corpus, deps):
    agent = deferring_agent(
        ScriptedModel([respond(ps("masks")), respond(call("ext", {}, "c9")), respond(pc("c-1", call_id="pc9")),
                       respond("answer")]),
        create_passages(corpus, SIGNER),
    )
    paused = await agent.run("q", deps=deps)
    assert isinstance(paused.output, DeferredToolRequests)
    await agent.run(message_history=paused.all_messages(), deps=deps,
                    deferred_tool_results=DeferredToolResults(calls={"c9": "done"}))
    assert citation_status([record(deps)], question=0) == "grounded"
    assert record(deps).occurrences["c-1"].retrieved_in_questions == [0]


# --- E1-E3 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("factory", [create_passages, create_reader])
def test_E1_R34_evidence_capabilities_refuse_deferred_loading(corpus, factory):
    with pytest.raises(ValueError, match="defer_loading"):
        factory(corpus, SIGNER, defer_loading=True)


async def test_E2_the_registered_instance_never_holds_state(corpus, deps):
    capability = create_passages(corpus, SIGNER)
    agent = Agent(ScriptedModel([respond(ps("masks")), respond("a")]), capabilities=[capability], deps_type=Deps)
    await agent.run("q", deps=deps)
    assert capability.state is None and capability.uses == {} and capability.request_count == 0
    assert record(deps).latest_evidence_epoch == 1


async def test_E2_concurrent_runs_on_one_agent_keep_independent_states(corpus):
    async def by_prompt(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        await asyncio.sleep(0.01)
        if any(isinstance(p, ToolReturnPart) for p in messages[-1].parts):
            return respond("done")
        prompt = messages[0].parts[0].content
        return respond(ps(prompt))

    agent = Agent(FunctionModel(by_prompt), capabilities=[create_passages(corpus, SIGNER)], deps_type=Deps)
    one, two = Deps(), Deps()
    await asyncio.gather(agent.run("topic1", deps=one), agent.run("topic7", deps=two))
    assert list(PassagesState.model_validate(one.state["passages"]).working_set) == ["topic1"]
    assert list(PassagesState.model_validate(two.state["passages"]).working_set) == ["topic7"]


async def test_E3_an_owned_store_is_closed_once_when_the_run_fails(deps):
    opened: list[FakeCorpus] = []

    def open_store() -> FakeCorpus:
        opened.append(FakeCorpus())
        return opened[-1]

    def fail(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise RuntimeError("model down")

    agent = Agent(ScriptedModel([respond(ps("masks")), fail]), capabilities=[create_passages(open_store, SIGNER)],
                  deps_type=Deps)
    with pytest.raises(RuntimeError, match="model down"):
        await agent.run("q", deps=deps)
    assert len(opened) == 1 and opened[0].closed == 1


async def test_E3_an_owned_store_is_opened_lazily_once_and_closed_after_the_run(deps):
    opened: list[FakeCorpus] = []

    async def open_store() -> FakeCorpus:
        opened.append(FakeCorpus())
        return opened[-1]

    capability = create_passages(open_store, SIGNER)
    agent = Agent(ScriptedModel([respond("no tools")]), capabilities=[capability], deps_type=Deps)
    await agent.run("q", deps=deps)
    assert opened == []
    agent = Agent(ScriptedModel([respond(ps("masks")), respond(ps("topic2", "ps2")), respond("a")]),
                  capabilities=[capability], deps_type=Deps)
    await agent.run("q", deps=Deps())
    assert len(opened) == 1 and opened[0].closed == 1 and opened[0].count("search") == 2


async def test_E3_an_owned_store_is_closed_on_cancellation(deps):
    opened: list[FakeCorpus] = []
    searched = asyncio.Event()

    def open_store() -> FakeCorpus:
        opened.append(FakeCorpus())
        return opened[-1]

    async def hang(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return respond(ps("masks"))
        searched.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    agent = Agent(FunctionModel(hang), capabilities=[create_passages(open_store, SIGNER)], deps_type=Deps)
    task = asyncio.create_task(agent.run("q", deps=deps))
    await searched.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert opened[0].closed == 1


async def test_E3_a_lent_store_is_never_closed(corpus, deps):
    agent = Agent(ScriptedModel([respond(ps("masks")), respond("a")]), capabilities=[create_passages(corpus, SIGNER)],
                  deps_type=Deps)
    await agent.run("q", deps=deps)
    assert corpus.count("search") == 1 and corpus.closed == 0


def test_E3_a_store_must_be_a_corpus_store_or_a_factory():
    with pytest.raises(TypeError, match="CorpusStore"):
        create_passages("corpus.db", SIGNER)  # type: ignore[arg-type]


# --- E17 discovery -----------------------------------------------------------------------------


async def test_E17a_discovery_sees_every_evidence_capability_with_its_evidence_tools(corpus, deps):
    spy = Spy()
    agent = Agent(ScriptedModel([respond("a")]),
                  capabilities=[create_reader(corpus, SIGNER), create_passages(corpus, SIGNER), spy], deps_type=Deps)
    await agent.run("q", deps=deps)
    assert {f.capability: f.tool_names for f in spy.seen[0]} == {
        "passages": {"passages_search"},
        "reader": {"reader_list_documents", "reader_read"},
    }
    assert [f.capability for f in spy.seen[0]] == ["passages", "reader"]
    assert [(f.cite_tool, f.cite_available, f.vision) for f in spy.seen[0]] == [
        ("passages_cite", True, False), ("reader_cite", True, False)]


async def test_E17b_without_evidence_capabilities_discovery_is_empty_and_the_run_answers(deps):
    spy = Spy()
    result = await Agent(ScriptedModel([respond("a")]), capabilities=[spy], deps_type=Deps).run("q", deps=deps)
    assert spy.seen == [[]] and spy.questions == [0]
    assert result.output == "a"


async def test_E17c_the_view_holds_the_run_question_while_the_registered_instance_holds_nothing(corpus, deps):
    spy = Spy()
    capability = create_passages(corpus, SIGNER)
    await Agent(ScriptedModel([respond("a")]), capabilities=[capability, spy], deps_type=Deps).run("q", deps=deps)
    assert spy.seen[0][0].record.question == 0
    assert capability.state is None


async def test_E17_views_are_copies_and_the_owner_is_the_run_instance(corpus, deps):
    seen: dict[str, Any] = {}

    @dataclass
    class Mutator(AbstractCapability[Any]):
        async def before_run(self, ctx: RunContext[Any]) -> None:
            view = discover_evidence(ctx)[0]
            view.record.question = 99
            owner = evidence_owner(ctx, "passages")
            seen["owner_in_registry"] = any(owner is c for c in ctx.capabilities.values())
            seen["question"] = owner.evidence_record().question
            seen["picture"] = await owner.get_picture_bytes("d-1", "#/pictures/0")
            with pytest.raises(RuntimeError, match="'nope'"):
                evidence_owner(ctx, "nope")

    await Agent(ScriptedModel([respond("a")]), capabilities=[create_passages(corpus, SIGNER), Mutator()],
                deps_type=Deps).run("q", deps=deps)
    assert seen == {"owner_in_registry": True, "question": 0, "picture": PNG}
    assert corpus.calls == [("get_picture_bytes", ("d-1", "#/pictures/0"))]


async def test_E17_a_views_citations_are_the_index_at_discovery_and_copies_when_read(corpus, deps):
    views: list[DiscoveredEvidence] = []
    titles: list[str | None] = []

    @dataclass
    class Watcher(AbstractCapability[Any]):
        async def after_model_request(self, ctx: RunContext[Any], *, request_context: Any,
                                      response: ModelResponse) -> ModelResponse:
            [view] = discover_evidence(ctx)
            views.append(view)
            if "c-1" in view.citations:
                view.citations["c-1"].document_title = "changed by a reader"
                titles.append(discover_evidence(ctx)[0].citations["c-1"].document_title)
            return response

    model = ScriptedModel([respond(ps("masks")), respond(pc("c-1")), respond("a")])
    await Agent(model, capabilities=[create_passages(corpus, SIGNER), Watcher()], deps_type=Deps).run("q", deps=deps)
    assert [sorted(view.citations) for view in views] == [[], [], ["c-1"]]
    assert titles and titles[0] != "changed by a reader"


# --- E18/E19 -----------------------------------------------------------------------------------


async def test_E18_evidence_capabilities_never_rewrite_the_request(corpus, deps):
    model = ScriptedModel([respond(ps("masks")), respond(pc("c-1")), respond("a")])
    result = await Agent(model, capabilities=[create_passages(corpus, SIGNER)], deps_type=Deps).run("q", deps=deps)
    history = result.all_messages()
    assert model.wire(3) == history[:-1]
    assert tool_returns(model.wire(3))[0].content == tool_returns(history)[0].content
    for cls in (type(create_passages(corpus, SIGNER)), type(create_reader(corpus, SIGNER)), EvidenceCapability):
        assert cls.wrap_model_request is AbstractCapability.wrap_model_request
        assert cls.prepare_model_request is AbstractCapability.prepare_model_request


@pytest.mark.parametrize("factory", [create_passages, create_reader])
def test_E19_two_evidence_capabilities_with_one_namespace_are_refused(corpus, factory):
    with pytest.raises(UserError, match="used by multiple capabilities"):
        Agent(ScriptedModel([]), capabilities=[factory(corpus, SIGNER), factory(corpus, SIGNER)])


# --- R32 persisted JSON ------------------------------------------------------------------------


@pytest.mark.parametrize("state_type", [PassagesState, ReaderState])
async def test_R32_states_survive_dump_load_dump_and_any_key_order(corpus, state_type):
    deps = Deps()
    model = ScriptedModel([
        respond(ps("masks")), respond(call("reader_read", {"document_id": "d-1", "page": 1}, "r1")),
        respond(pc("c-1"), call("reader_cite", {"chunk_ids": ["c-1"]}, "rc1")), respond("a"),
    ])
    agent = Agent(model, capabilities=[create_passages(corpus, SIGNER, vision=True),
                                       create_reader(corpus, SIGNER, vision=True)], deps_type=Deps)
    await agent.run("q", deps=deps)
    namespace = "passages" if state_type is PassagesState else "reader"
    dumped = deps.state[namespace]
    assert state_type.model_validate(dumped).model_dump(mode="json") == dumped
    reordered = {key: dumped[key] for key in reversed(list(dumped))} | {"added_later": 1}
    assert state_type.model_validate(reordered).model_dump(mode="json") == dumped
    results = [r for entries in dumped["working_set"].values() for r in entries]
    assert results and all("pictures" not in r for r in results)
    assert dumped["evidence"]["occurrences"]["c-1"]["capability"] == namespace
