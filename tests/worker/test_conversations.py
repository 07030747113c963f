"""Part H for conversations: stored history and state committed together, follow-ups with a fixed
composition, one job per conversation at a time, and the compactor on the recorded wire.

In-process tests run `run_conversation_job` against real Redis; integration tests use real worker
processes and a turn-aware fake OpenAI server (the model searches, cites and answers per turn).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from capabilities.capsule import CAPSULE_HEADER
from capabilities.compaction import RECEIPT, create_compactor
from capabilities.deps import Deps
from capabilities.passages import create_passages
from capabilities.policy import create_policy
from capabilities.tags import redirect_tag
from tests.conftest import REPO, TEST_TAG_KEY, RedisSpace, worker_env
from tests.harness import (
    SIGNER,
    FakeCorpus,
    ScriptedModel,
    pc,
    ps,
    respond,
    tool_returns,
    user_texts,
)
from tests.worker.conftest import (
    CORPUS,
    PASSAGES,
    POLICY,
    Cluster,
    question_config,
    settings_for,
)
from tests.worker.conversational_openai import ConversationalOpenAI, answer_for
from tests.worker.fake_openai import FakeOpenAI
from worker.client import BatchRejected, Conflict, GroundedClient, NotFound
from worker.jobs.composition import COMPACTOR, READER
from worker.jobs.lines import parse_batch
from worker.jobs.models import Batch, Job, JobConfig, TurnResult
from worker.producer import Producer
from worker.runtime.agents import BuiltAgent
from worker.runtime.conversations import run_conversation_job
from worker.runtime.run import Runtime
from worker.settings import Settings
from worker.store.conversations import CompositionMismatch, ConcurrentUpdate, ConversationStore, StoredTurn, lock_ttl_s
from worker.store.keys import BATCH_KEY, CONVERSATION_KEY, CONVERSATION_LOCK_KEY, CONVERSATION_TURNS_KEY

READER_ENTRY = {READER: {"corpus": CORPUS}}

QUESTIONS = [
    "When does the observatory open?",
    "How large is the reflector mirror?",
    "Which torches are allowed in the dome?",
    "Where is the assembly point in an emergency?",
    "How large is the refractor lens?",
]
MESSAGES_PER_TURN = 6  # U, M search, T results, M cite, T ack, M answer


@pytest.fixture(scope="module")
def chat() -> Iterator[ConversationalOpenAI]:
    server = ConversationalOpenAI().start()
    yield server
    server.stop()


def chat_config(server: FakeOpenAI, *capabilities: object) -> dict:
    return question_config(*capabilities, model="fake-model", endpoint={"base_url": server.base_url})


def history_questions(messages: list[ModelMessage]) -> list[str]:
    return [t for t in user_texts(messages) if "[cite-request" not in t]


def wire_returns(request: list[dict[str, Any]], tool_name: str) -> list[str]:
    """The contents of `tool_name`'s returns in one recorded request (H10 `wire`, as JSON)."""
    return [part["content"] for message in request if message["kind"] == "request"
            for part in message["parts"] if part["part_kind"] == "tool-return" and part["tool_name"] == tool_name]


def new_messages(turn: TurnResult) -> list[ModelMessage]:
    return ModelMessagesTypeAdapter.validate_json(turn.new_messages_json)


# --- in-process hosts: run_conversation_job against real Redis, with a fixed agent ---------------------


@dataclass
class FixedAgents:
    built: BuiltAgent

    def get(self, config: JobConfig, kind: str, *, tenant: str | None = None) -> BuiltAgent:
        return self.built


@dataclass
class FixedModels:
    model: Any

    def get(self, config: JobConfig) -> Any:
        return self.model


PLAIN = JobConfig.model_validate({"agent": {"model": "extractive"}})


def runtime_for(agent: Agent, model: Any, config: JobConfig = PLAIN) -> Runtime:
    built = BuiltAgent(agent=agent, composition=config.composition, namespaces=(), policy_registered=False,
                       compactor_registered=False)
    return Runtime(agents=FixedAgents(built), models=FixedModels(model), signer=SIGNER)  # type: ignore[arg-type]


def job_of(kind: str, prompts: list[str], *, conversation_id: str, job_id: str, config: JobConfig = PLAIN,
           tenant: str = "tests") -> tuple[Job, Batch]:
    batch = Batch(id=f"batch_{job_id}", tenant=tenant, config=config, total=1, created_at=datetime.now(UTC))
    fields = {"question": prompts[0]} if kind == "follow_up" else {"turns": prompts}
    job = Job(line_no=1, custom_id=job_id, kind=kind, id=job_id, batch_id=batch.id, conversation_id=conversation_id,
              **fields)
    return job, batch


def stored_batch(store: ConversationStore, batch: Batch) -> Batch:
    """Writes a hand-made batch's record as the producer would: a conversation lives only as long as
    the batch that started it (H16)."""
    store.redis.set(store.results.key(BATCH_KEY, batch_id=batch.id), batch.model_dump_json())
    return batch


def raw_conversation(store: ConversationStore, conversation_id: str) -> tuple[Any, ...]:
    """The stored bytes, to compare before and after."""
    key = store.results.key(CONVERSATION_KEY, conversation_id=conversation_id)
    turns = store.results.key(CONVERSATION_TURNS_KEY, conversation_id=conversation_id)
    return (*store.redis.hmget(key, "messages", "state", "version", "length"), store.redis.lrange(turns, 0, -1))


def last_prompt(messages: list[ModelMessage]) -> str:
    return user_texts(messages)[-1]


@pytest.fixture
def conversations(redis_space: RedisSpace) -> ConversationStore:
    return ConversationStore(redis_space.store())


def poke_then_fail(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Answers plainly, except "poke" turns: call the poking tool, then fail as a provider would."""
    if last_prompt(messages) != "poke":
        return ModelResponse(parts=[TextPart("a")])
    if isinstance(messages[-1].parts[-1], ToolReturnPart):
        raise RuntimeError("the model failed after the tool wrote state")
    return ModelResponse(parts=[ToolCallPart("poke", {}, "poke-1")])


def poking_agent() -> Agent:
    agent = Agent(deps_type=Deps)

    @agent.tool
    def poke(ctx: RunContext[Deps]) -> str:
        ctx.deps.state["passages"] = {"evidence": {"question": 0, "latest_evidence_epoch": 7}}
        return "poked"

    return agent


async def test_H4a_R17_a_failed_run_commits_nothing(conversations: ConversationStore) -> None:
    runtime = runtime_for(poking_agent(), FunctionModel(poke_then_fail))
    start, batch = job_of("conversation", ["hello"], conversation_id="conv-h4a", job_id="conv-h4a")
    first = await run_conversation_job(start, stored_batch(conversations, batch), runtime, conversations)
    assert first.status == "succeeded" and first.turns[0].answer == "a"
    before = raw_conversation(conversations, "conv-h4a")

    follow, batch = job_of("follow_up", ["poke"], conversation_id="conv-h4a", job_id="job-poke")
    failed = await run_conversation_job(follow, batch, runtime, conversations)

    assert failed.status == "failed" and failed.error is not None and failed.error.type == "RuntimeError"
    assert raw_conversation(conversations, "conv-h4a") == before
    stored = conversations.load("conv-h4a")
    assert stored is not None and "passages" not in stored.state and failed.state_after == stored.state
    assert failed.turns == [] and history_questions(stored.messages) == ["hello"]


async def test_H4b_R17_C15_state_committed_without_its_messages_makes_the_next_search_append_only() -> None:
    """The regression H4 prevents, simulated by a host that keeps a failed run's state but not its
    messages: the next turn continues the unfinished question 4 (L3) and its first search is refused."""
    corpus = FakeCorpus()
    deps = Deps()
    q0 = await Agent(ScriptedModel([respond(ps("q0")), respond("a")]), deps_type=Deps,
                     capabilities=[create_passages(corpus, SIGNER)]).run("q0", deps=deps)
    history = q0.all_messages()
    assert len(history) == 4 and deps.state["passages"]["evidence"]["in_progress"] is False

    def provider_down(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise RuntimeError("provider down")

    searching = ScriptedModel([respond(ps("a", "s1")), respond(ps("b", "s2")), respond(ps("c", "s3")), provider_down])
    with pytest.raises(RuntimeError, match="provider down"):
        await Agent(searching, deps_type=Deps, capabilities=[create_passages(corpus, SIGNER)]).run(
            "q4", message_history=history, deps=deps)
    evidence = deps.state["passages"]["evidence"]
    assert (evidence["question"], evidence["in_progress"], evidence["latest_evidence_epoch"]) == (4, True, 9)

    next_turn = ScriptedModel([respond(ps("d", "s4")), respond("b")])
    with pytest.raises(ValueError, match="append-only"):
        await Agent(next_turn, deps_type=Deps, capabilities=[create_passages(corpus, SIGNER)]).run(
            "q5", message_history=history, deps=deps)
    assert deps.state["passages"]["evidence"]["question"] == 4


async def test_H4_H5_a_commit_on_a_changed_version_fails_the_job_as_ConcurrentUpdate(
    conversations: ConversationStore,
) -> None:
    start, batch = job_of("conversation", ["hello"], conversation_id="conv-cas", job_id="conv-cas")
    plain = runtime_for(Agent(deps_type=Deps), FunctionModel(lambda m, i: ModelResponse(parts=[TextPart("a")])))
    await run_conversation_job(start, stored_batch(conversations, batch), plain, conversations)
    stored = conversations.load("conv-cas")
    assert stored is not None and stored.version == 1

    def another_job_commits_first(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        other = StoredTurn(job_id="other", custom_id="other", result=stored.turns[0].result)
        conversations.commit("conv-cas", version=1, messages=stored.messages, state={"other": True}, turn=other)
        return ModelResponse(parts=[TextPart("late")])

    racing = runtime_for(Agent(deps_type=Deps), FunctionModel(another_job_commits_first))
    follow, batch = job_of("follow_up", ["again"], conversation_id="conv-cas", job_id="job-late")
    result = await run_conversation_job(follow, batch, racing, conversations)

    assert result.status == "failed" and result.error is not None and result.error.type == ConcurrentUpdate.__name__
    after = conversations.load("conv-cas")
    assert after is not None and after.version == 2 and after.state == {"other": True}
    assert [t.job_id for t in after.turns] == ["conv-cas", "other"]
    with pytest.raises(ConcurrentUpdate):
        conversations.commit("conv-cas", version=1, messages=[], state={}, turn=after.turns[0])


async def test_H3_the_worker_refuses_a_different_composition_before_the_agent_runs(
    conversations: ConversationStore,
) -> None:
    calls: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.append(1)
        return ModelResponse(parts=[TextPart("a")])

    passages = JobConfig.model_validate(question_config(PASSAGES))
    with_reader = JobConfig.model_validate(question_config(PASSAGES, READER_ENTRY))
    _, start = job_of("conversation", ["q"], conversation_id="conv-h3w", job_id="conv-h3w", config=passages)
    conversations.create("conv-h3w", tenant="tests", config=passages, job_id="conv-h3w",
                         batch_id=stored_batch(conversations, start).id)
    before = raw_conversation(conversations, "conv-h3w")
    follow, batch = job_of("follow_up", ["q"], conversation_id="conv-h3w", job_id="job-h3w", config=with_reader)
    result = await run_conversation_job(follow, batch, runtime_for(Agent(deps_type=Deps), FunctionModel(model)),
                                        conversations)
    assert result.status == "failed" and result.error is not None
    assert result.error.type == CompositionMismatch.__name__
    assert "adds DocumentReaderCapability (namespace 'reader')" in result.error.message
    assert calls == [] and raw_conversation(conversations, "conv-h3w") == before


def test_H3_a_follow_up_that_adds_reader_is_rejected_naming_the_difference(
    redis_space: RedisSpace, data_dir: Path
) -> None:
    producer = Producer(settings_for(redis_space, data_dir))
    try:
        report = producer.validate([{"custom_id": "c", "turns": ["When does the observatory open?"]}],
                                   question_config(PASSAGES, POLICY, COMPACTOR))
        batch = producer.submit(report, tenant="tests")
        [conversation_id] = producer.store.job_ids(batch.id)
        with pytest.raises(CompositionMismatch) as rejected:
            producer.follow_up(conversation_id, "And the mirror?", tenant="tests",
                               config=question_config(PASSAGES, READER_ENTRY, POLICY, COMPACTOR))
        assert rejected.value.differences == ["adds DocumentReaderCapability (namespace 'reader')"]
        assert producer.conversations.job_ids(conversation_id) == [conversation_id]
        assert producer.store.tenant_batches("tests") == [batch.id]

        with pytest.raises(CompositionMismatch, match="removes EvidenceCompactionCapability"):
            producer.follow_up(conversation_id, "q", tenant="tests", config=question_config(PASSAGES, POLICY))
        same = producer.follow_up(conversation_id, "And the mirror?", tenant="tests")
        assert same.kind == "follow_up" and same.conversation_id == conversation_id
        assert producer.conversations.job_ids(conversation_id) == [conversation_id, same.id]
    finally:
        producer.app.close()


def test_H5_H14_the_lock_is_an_exclusive_lease_renewed_and_released_only_by_its_token(
    conversations: ConversationStore,
) -> None:
    settings = Settings(task_soft_limit_s=30, task_hard_limit_s=40, lease_s=7)
    first = conversations.lock("conv-lock", ttl_s=lock_ttl_s(settings))
    assert first is not None and conversations.lock("conv-lock", ttl_s=lock_ttl_s(settings)) is None
    assert 0 < conversations.redis.pttl(first.key) <= 7000  # a lease, not the job's time limit
    assert first.renew(30) is True and 7000 < conversations.redis.pttl(first.key) <= 30_000
    conversations.redis.set(first.key, "someone-else")  # as if it had expired and another job took it
    assert first.renew(30) is False and conversations.redis.ttl(first.key) == -1
    assert first.release() is False and conversations.redis.get(first.key) == b"someone-else"
    conversations.redis.delete(first.key)
    second = conversations.lock("conv-lock", ttl_s=lock_ttl_s(settings))
    assert second is not None and second.release() is True
    third = conversations.lock("conv-lock", ttl_s=1)
    assert third is not None
    with conversations.redis.pipeline(transaction=True) as pipe:  # as the job's result write lets go (H5)
        third.release_in(pipe)
        pipe.execute()
    assert not conversations.redis.exists(third.key) and third.renew(30) is True  # nothing left to renew


async def test_H11_a_library_host_carries_one_state_and_one_history() -> None:
    """One deps.state dict and one history, passed back together: the next question's identity is
    the history length and the compactor can rebuild the earlier evidence. A host that whitelists
    some state fields (here: only the policy's) breaks C14."""
    corpus = FakeCorpus()

    def agent(model: ScriptedModel) -> Agent:
        return Agent(model, deps_type=Deps, capabilities=[create_passages(corpus, SIGNER), create_policy(SIGNER),
                                                           create_compactor(SIGNER)])

    deps = Deps()
    first = await agent(ScriptedModel([respond(ps("masks")), respond(pc("c-1")), respond("a")])).run(
        "q0", deps=deps, conversation_id=deps.conversation_id)
    history = first.all_messages()
    second_model = ScriptedModel([respond(pc("c-1", call_id="pc2")), respond("b")])
    await agent(second_model).run("q1", message_history=history, deps=deps, conversation_id=deps.conversation_id)
    assert deps.state["passages"]["evidence"]["question"] == len(history)
    [carrier] = [r for r in tool_returns(second_model.wire(1)) if r.tool_name == "passages_search"]
    assert carrier.content.startswith(CAPSULE_HEADER) and "[c-1]" in carrier.content

    whitelisted = Deps(state={"citation_policy": copy.deepcopy(deps.state["citation_policy"])})
    with pytest.raises(RuntimeError, match="carry") as refused:
        await agent(ScriptedModel([respond("b")])).run("q1", message_history=history, deps=whitelisted)
    assert "passages" in str(refused.value)


# --- the trust boundary: producers send user turns only ----------------------------------------------


def test_trust_boundary_batch_lines_carry_only_user_text() -> None:
    config = question_config(PASSAGES)
    tag = redirect_tag(SIGNER, "conv-1", 4)
    lines = [
        {"custom_id": "a", "body": {"messages": [{"role": "user", "content": "q"},
                                                 {"role": "assistant", "content": "a"},
                                                 {"role": "user", "content": "q2"}]}},
        {"custom_id": "t", "body": {"messages": [{"role": "user", "content": "q"},
                                                 {"role": "tool", "tool_call_id": "x", "content": "EVIDENCE"}]}},
        {"custom_id": "h", "turns": ["q", {"role": "tool", "content": "EVIDENCE"}]},
        {"custom_id": "s", "turns": ["q"], "state": {"passages": {}}},
        {"custom_id": "g", "turns": ["q", f"follow-up {tag}"]},
        {"custom_id": "p", "question": "[evidence-image v1 cap=passages doc=d ref=r sig=00] look"},
    ]
    report = parse_batch(lines, config)
    problems = {e.line_no: e.problem for e in report.errors}
    assert "assistant messages would be history" in problems[1]
    assert "tool calls and tool results are not accepted" in problems[2]
    assert "never accepted as history" in problems[3]
    assert "unknown keys ['state']" in problems[4]
    assert "machine tag" in problems[5] and "turns[1]" in problems[5]
    assert "machine tag" in problems[6]
    assert not report.ok and report.jobs == []


# --- integration: real workers, real Redis ------------------------------------------------------------


def test_H5_the_lock_goes_with_the_result_write_so_a_turn_sent_on_seeing_the_end_starts_at_once(
    cluster: Cluster, chat: ConversationalOpenAI
) -> None:
    """Seeing a batch finished (a long poll answers within a millisecond) and sending the next turn
    must not find the conversation still locked: that turn would wait a retry's countdown (~2 s)."""
    start = run_conversation(cluster, chat_config(chat, PASSAGES, POLICY), [QUESTIONS[0]], custom_id="h5-free")
    lock_key = cluster.store.key(CONVERSATION_LOCK_KEY, conversation_id=start.conversation_id)
    assert not cluster.store.redis.exists(lock_key)  # released in the transaction that finished the job
    sent = time.monotonic()
    follow = cluster.producer.follow_up(start.conversation_id, QUESTIONS[1], tenant="tests")
    cluster.wait(follow.batch_id, timeout=30)
    assert time.monotonic() - sent < 1.5  # no lock wait
    assert not cluster.store.redis.exists(lock_key)


def run_conversation(cluster: Cluster, config: dict, turns: list[str], custom_id: str = "conv"):
    batch_id = cluster.submit([{"custom_id": custom_id, "turns": turns}], config)
    cluster.wait(batch_id, timeout=60)
    [result] = cluster.store.iter_results(batch_id)
    assert result.status == "succeeded", result.error
    return result


def test_H1_H10_five_turns_with_the_compactor_send_one_capsule_and_receipts(
    cluster: Cluster, chat: ConversationalOpenAI
) -> None:
    result = run_conversation(cluster, chat_config(chat, PASSAGES, POLICY, COMPACTOR), QUESTIONS)
    assert result.compactor_registered and result.policy_registered
    assert [t.question_identity for t in result.turns] == [MESSAGES_PER_TURN * k for k in range(5)]
    assert [t.citation_status for t in result.turns] == ["grounded"] * 5
    earlier = [c for t in result.turns[:4] for c in t.cited]
    assert len({c.chunk_id for c in earlier}) == 4

    first_request = result.turns[4].wire[0]
    searches = wire_returns(first_request, "passages_search")
    assert searches[:3] == [RECEIPT] * 3
    capsule = searches[3]
    assert capsule.startswith(CAPSULE_HEADER) and len(searches) == 4
    for cited in earlier:
        assert f"[{cited.chunk_id}]" in capsule and cited.content in capsule
    assert sum(CAPSULE_HEADER in json.dumps(r) for r in first_request) == 1
    live = wire_returns(result.turns[4].wire[1], "passages_search")
    assert live[:4] == searches and RECEIPT not in live[4] and CAPSULE_HEADER not in live[4]

    stored = cluster.producer.conversations.load(result.conversation_id)
    assert stored is not None and stored.version == 5 and stored.state == result.state_after
    assert RECEIPT not in json.dumps(ModelMessagesTypeAdapter.dump_python(stored.messages, mode="json"))


def test_H1_C1_the_same_job_without_the_compactor_sends_the_full_transcript(
    cluster: Cluster, chat: ConversationalOpenAI
) -> None:
    result = run_conversation(cluster, chat_config(chat, PASSAGES, POLICY), QUESTIONS)
    assert result.compactor_registered is False
    first_request = result.turns[4].wire[0]
    sent = wire_returns(first_request, "passages_search")
    stored = [r.content for t in result.turns[:4] for r in tool_returns(new_messages(t))
              if r.tool_name == "passages_search"]
    assert sent == stored and len(sent) == 4
    assert RECEIPT not in json.dumps(first_request) and CAPSULE_HEADER not in json.dumps(first_request)


def test_H7_a_turn_retried_after_a_transport_error_is_one_question(
    cluster: Cluster, chat: ConversationalOpenAI
) -> None:
    turns = [f"[h7] {QUESTIONS[0]}", f"[down:h7] {QUESTIONS[1]}"]
    result = run_conversation(cluster, chat_config(chat, PASSAGES), turns)
    assert result.attempts == 2
    assert [t.question_identity for t in result.turns] == [0, MESSAGES_PER_TURN]
    stored = cluster.producer.conversations.load(result.conversation_id)
    assert stored is not None and history_questions(stored.messages) == turns
    assert len(chat.asked(turns[0])) == 3  # turn 1 ran once: search, cite, answer
    assert len(chat.asked(turns[1])) == 4  # the 503, then search, cite, answer


def wait_for_job(client: GroundedClient, job_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (job := client.job(job_id))["result"] is None:
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    return job["result"]


def test_H5_two_follow_ups_sent_at_once_run_one_after_the_other(
    cluster: Cluster, chat: ConversationalOpenAI, api_url: str
) -> None:
    with GroundedClient(api_url, "tok-acme") as acme, GroundedClient(api_url, "tok-globex") as globex:
        accepted = acme.submit([{"custom_id": "h5", "turns": [QUESTIONS[0]]}], chat_config(chat, PASSAGES, POLICY))
        [start] = list(acme.results(acme.wait(accepted["id"], timeout=30)["id"]))
        conversation_id = start["conversation_id"]

        slow, quick = f"[slow:h5] {QUESTIONS[1]}", f"[h5] {QUESTIONS[2]}"
        first = acme.follow_up(conversation_id, slow)
        second = acme.follow_up(conversation_id, quick)
        while not chat.asked(slow):
            time.sleep(0.05)
        waiting = acme.conversation(conversation_id)["turns"]
        assert [(t["question"], t["status"]) for t in waiting] == [
            (QUESTIONS[0], "succeeded"), (slow, "running"), (quick, "queued")]

        first_result, second_result = wait_for_job(acme, first["job_id"]), wait_for_job(acme, second["job_id"])
        assert first_result["status"] == second_result["status"] == "succeeded"
        assert chat.asked(quick)[0]["at"] >= chat.asked(slow)[-1]["at"]
        assert second_result["attempts"] == 1
        [committed_first] = first_result["turns"]
        assert second_result["turns"][0]["question_identity"] == committed_first["question_identity"] + MESSAGES_PER_TURN

        view = acme.conversation(conversation_id)
        assert view["version"] == 3 and view["history_length"] == 3 * MESSAGES_PER_TURN
        assert [(t["turn"], t["question"], t["status"], t["kind"]) for t in view["turns"]] == [
            (1, QUESTIONS[0], "succeeded", "conversation"), (2, slow, "succeeded", "follow_up"),
            (3, quick, "succeeded", "follow_up")]
        assert all(t["citation_status"] == "grounded" and t["cited"] and t["answer"] == answer_for(t["question"])
                   for t in view["turns"])
        assert "wire" not in view["turns"][0] and acme.conversation(conversation_id, wire=True)["turns"][0]["wire"]
        stored = cluster.producer.conversations.load(conversation_id)
        assert stored is not None and history_questions(stored.messages) == [QUESTIONS[0], slow, quick]

        with pytest.raises(NotFound):
            globex.conversation(conversation_id)
        with pytest.raises(NotFound):
            globex.follow_up(conversation_id, "mine now?")
        with pytest.raises(Conflict, match="adds DocumentReaderCapability"):
            acme.follow_up(conversation_id, "q", config=chat_config(chat, PASSAGES, READER_ENTRY, POLICY))
        with pytest.raises(BatchRejected, match="history, tool calls, tool results and evidence state"):
            acme._check(acme.http.post(f"/v1/conversations/{conversation_id}/turns",
                                       json={"question": "q", "history": [{"role": "assistant", "content": "a"}]}))
        with pytest.raises(BatchRejected, match="machine tag"):
            acme.follow_up(conversation_id, f"again {redirect_tag(SIGNER, conversation_id, 18)}")
        assert acme.conversation(conversation_id)["version"] == 3


def test_H3_cli_ask_adds_a_turn_with_the_stored_composition(cluster: Cluster, chat: ConversationalOpenAI,
                                                              data_dir: Path) -> None:
    start = run_conversation(cluster, chat_config(chat, PASSAGES, POLICY, COMPACTOR), [QUESTIONS[0]])
    env = {k: v for k, v in os.environ.items() if not k.startswith("GROUNDED_")}
    env.update(GROUNDED_REDIS_URL=cluster.space.url, GROUNDED_KEY_PREFIX=cluster.space.prefix,
               GROUNDED_DATA_DIR=str(data_dir), GROUNDED_TAG_KEYS=TEST_TAG_KEY, GROUNDED_CLI_TENANT="tests",
               COLUMNS="200")
    asked = subprocess.run([sys.executable, "-m", "worker.cli", "ask", "--conversation", start.conversation_id,
                            QUESTIONS[1]], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert answer_for(QUESTIONS[1]) in asked.stdout and "grounded" in asked.stdout
    [_, follow] = cluster.producer.conversations.turns(start.conversation_id)
    assert follow.result.question_identity == MESSAGES_PER_TURN
    result = cluster.store.load_result(follow.job_id)
    assert result is not None and result.kind == "follow_up"
    assert result.compactor_registered and result.policy_registered


def test_H4_H6_a_worker_killed_between_turns_2_and_3_resumes_at_turn_3(
    redis_space: RedisSpace, data_dir: Path, worker_process, chat: ConversationalOpenAI
) -> None:
    """kill -9 while turn 3 waits on the model: turns 1-2 are committed, and the redelivered job
    re-runs turn 3 as the same question, with nothing of turns 1-2 run twice."""
    env = worker_env(redis_space, data_dir, GROUNDED_TASK_SOFT_LIMIT_S="60", GROUNDED_TASK_HARD_LIMIT_S="60",
                     GROUNDED_RETRY_MAX_S="1")
    producer = Producer(settings_for(redis_space, data_dir))
    cluster = Cluster(redis_space, worker_process(env), producer)
    turns = [f"[kill6] {QUESTIONS[0]}", f"[kill6] {QUESTIONS[1]}", f"[slow:kill6] {QUESTIONS[2]}",
             f"[kill6] {QUESTIONS[3]}"]
    batch_id = cluster.submit([{"custom_id": "k", "turns": turns}], chat_config(chat, PASSAGES, POLICY,
                                                                                COMPACTOR))
    [conversation_id] = producer.store.job_ids(batch_id)
    deadline = time.monotonic() + 30
    while not chat.asked(turns[2]):
        assert time.monotonic() < deadline, cluster.worker.output()
        time.sleep(0.02)
    cluster.worker.kill()
    stored = producer.conversations.load(conversation_id)
    assert stored is not None and stored.version == 2 and history_questions(stored.messages) == turns[:2]

    cluster.worker = worker_process(env)
    cluster.wait(batch_id, timeout=60)
    [result] = cluster.store.iter_results(batch_id)
    assert result.status == "succeeded" and result.attempts == 2
    assert [t.question_text for t in result.turns] == turns
    assert [t.question_identity for t in result.turns] == [MESSAGES_PER_TURN * k for k in range(4)]
    stored = producer.conversations.load(conversation_id)
    assert stored is not None and stored.version == 4 and history_questions(stored.messages) == turns
    assert [len(chat.asked(t)) for t in turns] == [3, 3, 4, 3]  # turn 3: the killed request, then a full turn
    producer.app.close()
