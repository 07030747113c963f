"""What the capabilities cost in-process, and what the compactor saves on the wire.

Overhead: one question, search → cite → answer, run by an agent with passages + policy +
compactor registered, by an agent whose plain function tools make the same store calls (search,
expand_context) and show results with the same formatter, and by a framework floor: the plain
tools owned by a capability, plus capabilities overriding the same hooks as ours and passing
through, so the floor separates what pydantic-ai's capability machinery costs from what our code
costs. The model is a stateless `FunctionModel` that decides each step from the messages, so all
agents get identical turns and no script copying is timed. Runs rotate in one event loop; ratios
are of medians.

Compaction: an N-question conversation (deps.state and history carried between runs) over a
synthetic SQLite corpus with 800-character chunks, with and without the compactor; the size of the
last request as the model received it, and the time to build the capsule for it.

Run: `.venv/bin/python -m bench.overhead_capabilities`.
"""

from __future__ import annotations

import asyncio
import gc
import random
import re
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, FunctionToolset, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import ToolDefinition

from bench.search import SEED, build_corpus, queries, vocabulary
from bench.table import median, row
from capabilities.capsule import build_capsule
from capabilities.citing import cite_ack
from capabilities.compaction import compact_history, create_compactor
from capabilities.corpus import SQLiteCorpus
from capabilities.evidence import DiscoveredEvidence
from capabilities.formatting import format_results
from capabilities.passages import PassagesState, create_passages
from capabilities.policy import create_policy
from capabilities.store import CorpusStore, RetrievedChunk
from tests.harness import SIGNER, Deps, FakeCorpus

SEARCH = "passages_search"
CITE = "passages_cite"
ANSWER = "The answer, from the passages found."
GOAL_OVERHEAD = 1.2
GOAL_OVER_FLOOR = 1.05  # issue 16: what our capabilities add to pydantic-ai's own cost
ITERATIONS = 300
WARMUP = 30
CORPUS_CHUNKS = 2_000
CONVERSATION_TURNS = (5, 10, 20)
CAPSULE_REPEATS = 300
CITED_PER_ANSWER = 2
_CHUNK_ID = re.compile(r"^\[([^\]]+)\] \[rank", re.MULTILINE)


# --- the model: the same turns for every agent, decided from the messages -----------------------


def _question(messages: Sequence[ModelMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    return ""


def search_cite_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Search with the question, cite the first results shown, then answer."""
    last = messages[-1]
    returns = [p for p in last.parts if isinstance(p, ToolReturnPart)] if isinstance(last, ModelRequest) else []
    if not returns:
        return ModelResponse(parts=[ToolCallPart(SEARCH, {"query": _question(messages)}, tool_call_id="s")])
    if returns[0].tool_name == SEARCH:
        shown = _CHUNK_ID.findall(returns[0].model_response_str())
        return ModelResponse(parts=[ToolCallPart(CITE, {"chunk_ids": shown[:CITED_PER_ANSWER]}, tool_call_id="c")])
    return ModelResponse(parts=[TextPart(ANSWER)])


def model() -> FunctionModel:
    return FunctionModel(search_cite_answer, model_name="bench-scripted")


# --- the three agents ---------------------------------------------------------------------------


def evidence_and_policy(store: CorpusStore) -> list[AbstractCapability[Any]]:
    return [create_passages(store, SIGNER), create_policy(SIGNER)]


def capability_agent(store: CorpusStore) -> Agent[Deps, str]:
    return Agent(model(), capabilities=[*evidence_and_policy(store), create_compactor(SIGNER)], deps_type=Deps)


@dataclass
class PlainDeps:
    retrieved: dict[str, RetrievedChunk] = field(default_factory=dict)
    cited: list[str] = field(default_factory=list)


def plain_tools(store: CorpusStore) -> list[Callable[..., Awaitable[str]]]:
    """The same calls without our capabilities: a tool that searches and shows, one that records."""

    async def passages_search(ctx: RunContext[PlainDeps], query: str, limit: int | None = None) -> str:
        """Search the knowledge base for passages relevant to the query."""
        found = await store.search(query, limit=limit or 5, filter=None)
        results = await store.expand_context(found)
        ctx.deps.retrieved.update((r.chunk_id, r) for r in results)
        return format_results(results)

    async def passages_cite(ctx: RunContext[PlainDeps], chunk_ids: list[str]) -> str:
        """Declare the chunk_ids that ground the answer."""
        cited = [c for c in chunk_ids if c in ctx.deps.retrieved]
        ctx.deps.cited.extend(cited)
        return cite_ack(len(cited))

    return [passages_search, passages_cite]


PLAIN_INSTRUCTIONS = "Search the knowledge base, cite what supports the answer, then answer."


def plain_agent(store: CorpusStore) -> Agent[PlainDeps, str]:
    return Agent(model(), tools=plain_tools(store), deps_type=PlainDeps, instructions=PLAIN_INSTRUCTIONS)


@dataclass
class _PassThroughEvidence(AbstractCapability[Any]):
    """The hooks an evidence capability overrides, doing nothing, and the plain tools as its own
    toolset (as ours are): the framework's cost of that shape."""

    tools: FunctionToolset[Any] | None = None

    def get_toolset(self) -> FunctionToolset[Any] | None:
        return self.tools

    async def for_run(self, ctx: RunContext[Any]) -> AbstractCapability[Any]:
        return replace(self)

    async def wrap_run(self, ctx: RunContext[Any], *, handler: Any) -> Any:
        return await handler()

    async def after_run(self, ctx: RunContext[Any], *, result: Any) -> Any:
        return result

    async def prepare_tools(self, ctx: RunContext[Any], tool_defs: list[ToolDefinition]) -> list[ToolDefinition]:
        return tool_defs

    async def before_model_request(self, ctx: RunContext[Any], request_context: ModelRequestContext) -> ModelRequestContext:
        return request_context

    async def wrap_tool_execute(self, ctx: RunContext[Any], *, call: Any, tool_def: Any, args: Any, handler: Any) -> Any:
        return await handler(args)


@dataclass
class _PassThroughPolicy(AbstractCapability[Any]):
    async def before_run(self, ctx: RunContext[Any]) -> None:
        return None

    async def after_model_request(self, ctx: RunContext[Any], *, request_context: Any, response: ModelResponse) -> ModelResponse:
        return response

    async def after_run(self, ctx: RunContext[Any], *, result: Any) -> Any:
        return result


@dataclass
class _PassThroughCompactor(AbstractCapability[Any]):
    async def for_run(self, ctx: RunContext[Any]) -> AbstractCapability[Any]:
        return replace(self)

    async def before_run(self, ctx: RunContext[Any]) -> None:
        return None

    async def wrap_model_request(self, ctx: RunContext[Any], *, request_context: Any, handler: Any) -> ModelResponse:
        return await handler(request_context)


def floor_agent(store: CorpusStore) -> Agent[PlainDeps, str]:
    """The plain tools, owned by a capability, plus three capabilities that override the same hooks
    as ours and pass through: what the framework costs before any of our code runs."""
    tools = FunctionToolset(plain_tools(store), max_retries=3, sequential=True)
    passthrough = [_PassThroughEvidence(id="floor-evidence", tools=tools), _PassThroughPolicy(id="floor-policy"),
                   _PassThroughCompactor(id="floor-compactor")]
    return Agent(model(), deps_type=PlainDeps, instructions=PLAIN_INSTRUCTIONS, capabilities=passthrough)


# --- timing ---------------------------------------------------------------------------------------


async def interleaved(arms: Sequence[Callable[[int], Awaitable[Any]]], iterations: int, warmup: int) -> list[list[float]]:
    """ms per call of each arm. The order rotates every iteration, so drift on a shared machine
    and whatever one arm leaves behind (garbage, warm caches) hit every arm alike."""
    for i in range(warmup):
        for arm in arms:
            await arm(i)
    times: list[list[float]] = [[] for _ in arms]
    for i in range(iterations):
        for k in range(len(arms)):
            j = (i + k) % len(arms)
            start = time.perf_counter()
            await arms[j](i)
            times[j].append((time.perf_counter() - start) * 1000)
    return times


@dataclass(frozen=True)
class Overhead:
    """Median ms per question for each agent."""

    capabilities: float
    floor: float
    plain: float


async def overhead(store: CorpusStore, questions: Sequence[str], iterations: int = ITERATIONS) -> Overhead:
    with_caps = capability_agent(store)
    floor = floor_agent(store)
    plain = plain_agent(store)

    async def run_caps(i: int) -> None:
        deps = Deps()
        result = await with_caps.run(questions[i % len(questions)], deps=deps)
        assert result.output == ANSWER and deps.state["passages"]["citations"], "the capability run did not cite"

    def run_plain_with(agent: Agent[PlainDeps, str]) -> Callable[[int], Awaitable[None]]:
        async def run(i: int) -> None:
            deps = PlainDeps()
            result = await agent.run(questions[i % len(questions)], deps=deps)
            assert result.output == ANSWER and deps.cited, "the plain run did not cite"

        return run

    gc.collect()
    caps_ms, floor_ms, plain_ms = await interleaved([run_caps, run_plain_with(floor), run_plain_with(plain)],
                                                    iterations, WARMUP)
    return Overhead(median(caps_ms), median(floor_ms), median(plain_ms))


def overhead_rows(label: str, measured: Overhead) -> list[dict[str, Any]]:
    return [
        row(f"capabilities vs plain tools, one question, {label}", measured.capabilities / measured.plain, "×",
            GOAL_OVERHEAD, note=f"{measured.capabilities:.2f} vs {measured.plain:.2f} ms"),
        row("↳ framework floor (pass-through hooks, capability-owned tools) vs plain tools",
            measured.floor / measured.plain, "×", note=f"{measured.floor:.2f} ms"),
        row("↳ our code: capabilities vs framework floor", measured.capabilities / measured.floor, "×", GOAL_OVER_FLOOR),
    ]


# --- compaction -----------------------------------------------------------------------------------


@dataclass
class Conversation:
    last_wire_bytes: int
    last_wire_chars: int
    state: dict[str, Any]
    history: list[ModelMessage]


def _chars(messages: Sequence[ModelMessage]) -> int:
    total = 0
    for message in messages:
        for part in message.parts:
            content = getattr(part, "content", None)
            if isinstance(content, str):
                total += len(content)
            elif isinstance(content, list):
                total += sum(len(item) for item in content if isinstance(item, str))
            elif isinstance(part, ToolCallPart):
                total += len(part.args_as_json_str())
    return total


async def conversation(
    store: CorpusStore, questions: Sequence[str], extra: Sequence[AbstractCapability[Any]]
) -> Conversation:
    """Passages + policy + `extra`, one run per question, history and state carried."""
    wires: list[list[ModelMessage]] = []

    def recording(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        wires.append(list(messages))
        return search_cite_answer(messages, info)

    capabilities = [*evidence_and_policy(store), *extra]
    agent = Agent(FunctionModel(recording, model_name="bench-scripted"), capabilities=capabilities, deps_type=Deps)
    deps = Deps()
    history: list[ModelMessage] = []
    for question in questions:
        result = await agent.run(question, message_history=history or None, deps=deps)
        history = result.all_messages()
    last = wires[-1]
    return Conversation(
        last_wire_bytes=len(ModelMessagesTypeAdapter.dump_json(last)),
        last_wire_chars=_chars(last),
        state=deps.state,
        history=history,
    )


def discovered(state: dict[str, Any]) -> list[DiscoveredEvidence]:
    """What the compactor's discovery would see at the start of the next question."""
    passages = PassagesState.model_validate(state["passages"])
    return [
        DiscoveredEvidence(
            capability="passages",
            record=passages.evidence,
            citations=passages.citation_index,
            tool_names=frozenset({SEARCH}),
            cite_tool=CITE,
            cite_available=True,
            state_carried=True,
            vision=False,
        )
    ]


def capsule_timings(done: Conversation) -> tuple[float, float]:
    """µs per build_capsule and per compact_history for the next question of the conversation."""
    found = discovered(done.state)
    boundary = len(done.history)
    start = time.perf_counter()
    for _ in range(CAPSULE_REPEATS):
        capsule = build_capsule(found, boundary=boundary)
    build_us = (time.perf_counter() - start) / CAPSULE_REPEATS * 1e6
    start = time.perf_counter()
    for _ in range(CAPSULE_REPEATS):
        compact_history(done.history, boundary=boundary, owned={SEARCH}, capsule_text=capsule.text,
                        capsule_images=[], signer=SIGNER)
    compact_us = (time.perf_counter() - start) / CAPSULE_REPEATS * 1e6
    return build_us, compact_us


# --- the benchmark ------------------------------------------------------------------------------


async def _sqlite_rows(folder: Path) -> list[dict[str, Any]]:
    rng = random.Random(SEED)
    words, cum_weights = vocabulary(rng)
    path = folder / "corpus.db"
    build_corpus(path, CORPUS_CHUNKS, words, cum_weights, rng)
    store = SQLiteCorpus(path)
    rows: list[dict[str, Any]] = []
    try:
        texts = [q for q in queries(words, cum_weights, rng) if len(await store.search(q, limit=5, filter=None)) >= 2]
        rows += overhead_rows(f"SQLite {CORPUS_CHUNKS // 1000}k chunks", await overhead(store, texts))
        for turns in CONVERSATION_TURNS:
            asked = texts[:turns]
            with_c = await conversation(store, asked, [create_compactor(SIGNER)])
            without = await conversation(store, asked, [])
            rows.append(row(f"compaction: last request of a {turns}-question conversation, with / without",
                            with_c.last_wire_bytes / without.last_wire_bytes, "×",
                            note=f"{with_c.last_wire_bytes:,} vs {without.last_wire_bytes:,} bytes; "
                                 f"{with_c.last_wire_chars:,} vs {without.last_wire_chars:,} chars"))
            if turns == CONVERSATION_TURNS[-1]:
                build_us, compact_us = capsule_timings(with_c)
                rows.append(row(f"↳ capsule build, {turns - 1} earlier answers cited", build_us / 1000, "ms"))
                rows.append(row(f"↳ compact_history over {len(with_c.history)} messages", compact_us / 1000, "ms"))
    finally:
        await store.close()
    return rows


async def _run() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    corpus = FakeCorpus()
    questions = [f"masks topic{i % 9 + 1}" for i in range(ITERATIONS)]
    rows += overhead_rows("in-memory corpus", await overhead(corpus, questions))
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as folder:
        rows += await _sqlite_rows(Path(folder))
    return rows


def run() -> list[dict[str, Any]]:
    return asyncio.run(_run())


if __name__ == "__main__":
    from bench.table import print_run

    print_run(run)
