"""The evidence capability base: state, the per-run lifecycle, the store and the cite tool.

An evidence capability retrieves material, shows it with chunk ids, and checks the model's
citations against what it retrieved. It never rewrites a request and never requires a citation
(E18): registering the compactor rewrites, and registering the policy enforces.
"""

from __future__ import annotations

import asyncio
import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar, cast

from pydantic import BaseModel, Field
from pydantic_ai import (
    FunctionToolset,
    ModelRetry,
    RunContext,
    Tool,
    ToolFailed,
)
from pydantic_ai._function_schema import FunctionSchema
from pydantic_ai.capabilities import (
    AbstractCapability,
    ValidatedToolArgs,
    WrapRunHandler,
    WrapToolExecuteHandler,
)
from pydantic_ai.messages import (
    BinaryContent,
    InstructionPart,
    ToolCallPart,
    ToolReturn,
)
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import ToolDefinition

from .budgets import (
    GRACE_REQUESTS,
    budget_notice,
    called_own_tool,
    limit_reached,
    spent_tools,
    tools_to_offer,
)
from .citing import (
    CHUNK_ID_MATCH_CUTOFF,
    CITE_NONE_ACK,
    citation_for,
    cite_ack,
    no_citation_message,
    normalise_chunk_id,
    register_citations,
    repair_chunk_id,
    results_by_chunk_id,
)
from .deps import host_state
from .formatting import NO_RESULTS, merge_results
from .ledger import CapabilityEvidenceRecord, EvidenceRef
from .pictures import picture_content_for
from .questions import paused, question_identity, refuse_unrecorded_resumption, state_carried
from .store import Citation, CorpusStore, Document, RetrievedChunk
from .tags import TagSigner

__all__ = [
    "CHUNK_ID_MATCH_CUTOFF",
    "CITE_NONE_ACK",
    "GRACE_REQUESTS",
    "NO_RESULTS",
    "EvidenceCapability",
    "EvidenceState",
    "StoreFactory",
    "cite_ack",
]

T = TypeVar("T")
StoreFactory = Callable[[], "CorpusStore | Awaitable[CorpusStore]"]
"""Opens a store owned by one run: opened lazily, closed when the run ends (E3)."""

_tool_schemas: dict[tuple[Callable[..., Any], str], FunctionSchema] = {}


def run_tool(method: Callable[..., Any], *, name: str, description: str | None = None) -> Tool[Any]:
    """A tool bound to a run copy's method. The toolset is rebuilt for every run (E2), and building
    a function schema (signature and docstring parsing) cost more than the rest of a scripted run
    together (bench/overhead_capabilities.py), so it is built once per method and tool name."""
    key = (getattr(method, "__func__", method), name)
    schema = _tool_schemas.get(key)
    if schema is None:
        tool = Tool(method, name=name, description=description)
        _tool_schemas[key] = tool.function_schema
        return tool
    return Tool(method, name=name, description=description, function_schema=replace(schema, function=method))


class EvidenceState(BaseModel):
    """One evidence capability's state under `deps.state[namespace]` (docs/design/rules/README.md,
    "Persisted state").

    Field names and nesting are a compatibility surface: add fields only with defaults, never
    rename them. Unknown keys are ignored on load and picture bytes are never dumped.
    """

    citation_index: dict[str, Citation] = Field(default_factory=dict)
    citations: list[str] = Field(default_factory=list)
    evidence: CapabilityEvidenceRecord = Field(default_factory=CapabilityEvidenceRecord)
    document_filter: str | None = None
    working_set: dict[str, list[RetrievedChunk]] = Field(default_factory=dict)

    def begin_question(self, identity: int) -> None:
        """L3. A new question starts with empty per-question views; the conversation-wide index,
        the scope the host set and the occurrences stay."""
        self.evidence.begin_question(identity)
        self.citations = []
        self.working_set = {}


@dataclass
class EvidenceCapability(AbstractCapability[Any], ABC):
    """The shared lifecycle of evidence capabilities (Parts L and E).

    The registered instance holds configuration only; `for_run` returns a copy that holds the
    run's state, counters and store connection, so concurrent runs of one agent never share
    evidence (E2).
    """

    state_type: ClassVar[type[EvidenceState]] = EvidenceState
    heading: ClassVar[str]

    _: KW_ONLY
    store: CorpusStore | StoreFactory
    """A store lent by the host (used, never closed) or a factory for one this run owns (E3)."""
    signer: TagSigner
    namespace: str
    """State key and tool prefix; the id derives from it, so two of one namespace collide (E19)."""
    vision: bool = False
    """Whether pictures are attached to results; should match the driving model."""
    request_limit: int | None = None
    instructions_preamble: str | None = None
    store_lent: bool | None = field(default=None, repr=False)
    """Whether `store` is a lent store rather than a factory: decided once, by the registered
    instance, and carried by its run copies. Checking a runtime protocol costs 10-20 µs, and a run
    asked three times (each run copy's construction, opening, closing)."""

    state: EvidenceState | None = field(default=None, repr=False)
    """Run copies only (as are the fields below): the registered instance never holds state."""
    host: dict[str, Any] | None = field(default=None, repr=False)
    state_carried: bool = field(default=False, repr=False)
    epoch: int = field(default=0, repr=False)
    request_count: int = field(default=0, repr=False)
    grace_requests_used: int = field(default=0, repr=False)
    uses: dict[str, int] = field(default_factory=dict, repr=False)
    connection: CorpusStore | None = field(default=None, repr=False)
    lock: asyncio.Lock | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.defer_loading:
            raise ValueError(
                f"{type(self).__name__} cannot use defer_loading=True: an unloaded deferred capability "
                "gets for_run but not after_run (F8), so its question would stay in progress forever"
            )
        if self.id is None:
            self.id = f"evidence-{self.namespace}"
        if self.store_lent is None:
            self.store_lent = isinstance(self.store, CorpusStore) and not isinstance(self.store, type)
        if not (self.store_lent or callable(self.store)):
            raise TypeError(f"store must be a CorpusStore or a zero-argument factory of one, not {self.store!r}")

    # --- what each concrete capability declares -------------------------------------------------

    @abstractmethod
    def evidence_tools(self) -> list[Tool[Any]]:
        """The tools whose output is evidence (E9)."""

    @abstractmethod
    def tool_budgets(self) -> dict[str, int]:
        """Evidence tool name -> calls allowed per run, in declaration order (E6.1, E7, E8)."""

    @abstractmethod
    def tool_guidance(self) -> str:
        """What the evidence tools are for, in the capability's instructions."""

    # --- public members: what discovery reads (E17) -----------------------------------------------

    def evidence_tool_names(self) -> frozenset[str]:
        """E9. Never the cite tool: a cite acknowledgement records the model's own action (C4)."""
        return frozenset(self.tool_budgets())

    @property
    def cite_tool_name(self) -> str:
        return f"{self.namespace}_cite"

    @property
    def cite_available(self) -> bool:
        """E12. Whether the cite tool will be declared on the next request."""
        return self.grace_requests_used < GRACE_REQUESTS

    def evidence_record(self) -> CapabilityEvidenceRecord:
        """This capability's ledger (the live one: only its owner may write it, L11)."""
        return self.run_state().evidence

    def citation_index(self) -> Mapping[str, Citation]:
        """Every citation registered in the conversation, read-only."""
        return MappingProxyType(self.run_state().citation_index)

    async def get_picture_bytes(self, document_id: str, self_ref: str) -> bytes | None:
        """E16. Through this run's own store connection, never cached in state: the compactor
        re-attaches cited pictures through the capability that retrieved them."""
        return await self.with_store(lambda store: store.get_picture_bytes(document_id, self_ref))

    # --- lifecycle ------------------------------------------------------------------------------

    async def for_run(self, ctx: RunContext[Any]) -> EvidenceCapability:
        """E2 with L1/L3/L13/L14. Opens no resources (F1): nothing would close them if the run
        failed before starting."""
        host = host_state(ctx.deps)
        loaded = host.get(self.namespace) if host is not None else None
        state = self.state_type.model_validate(loaded or {})
        carried = state_carried(state.evidence)
        refuse_unrecorded_resumption(state.evidence, ctx.messages, self.namespace)
        if not state.evidence.in_progress:
            state.begin_question(question_identity(ctx.messages, ctx.prompt))
        run = replace(
            self,
            state=state,
            host=host,
            state_carried=carried,
            epoch=len(ctx.messages),
            request_count=0,
            grace_requests_used=0,
            uses={},
            connection=None,
            lock=asyncio.Lock(),
        )
        run.sync()
        return run

    async def wrap_run(self, ctx: RunContext[Any], *, handler: WrapRunHandler) -> AgentRunResult[Any]:
        """E3. Cleanup that must survive a failed or cancelled run lives here, not in after_run (F7)."""
        try:
            return await handler()
        finally:
            await self.close_owned_store()

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        """L6. A paused run has not finished its question; the next run resumes it."""
        if not paused(result.output):
            self.run_state().evidence.end_question()
        self.sync()
        return result

    async def prepare_tools(self, ctx: RunContext[Any], tool_defs: list[ToolDefinition]) -> list[ToolDefinition]:
        """E13."""
        return tools_to_offer(
            tool_defs,
            capability_id=self.id or "",
            cite_tool=self.cite_tool_name,
            cite_available=self.cite_available,
            limit_reached=limit_reached(self.request_count, self.request_limit),
        )

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        """L4 and E12/E14. The notice is computed from the counters `prepare_tools` just used, before
        this request's own increments, so it never names a tool withdrawn on this request."""
        self.epoch = len(ctx.messages)
        notice = self.budget_notice()
        if limit_reached(self.request_count, self.request_limit) and called_own_tool(
            ctx.messages, self.own_tool_names()
        ):
            self.grace_requests_used += 1
        self.request_count += 1
        if notice is None:
            return request_context
        params = request_context.model_request_parameters
        parts = [*(params.instruction_parts or []), InstructionPart(notice, dynamic=True)]
        return replace(request_context, model_request_parameters=replace(params, instruction_parts=parts))

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        """L12. Evidence gathered before a failure must reach the host, so every call of our
        tools syncs, including one that raises."""
        if tool_def.capability_id != self.id:
            return await handler(args)
        try:
            return await handler(args)
        finally:
            self.sync()

    def get_toolset(self) -> FunctionToolset[Any]:
        """E5."""
        cite = run_tool(self.cite, name=self.cite_tool_name, description=self.cite_description())
        return FunctionToolset([*self.evidence_tools(), cite], max_retries=3, sequential=True)

    def get_instructions(self) -> str:
        """E5. Citing is always recorded and validated; the policy only enforces what these
        instructions already ask."""
        body = "\n".join(
            [
                f"## {self.heading}",
                self.tool_guidance(),
                f"- Before every final answer, call {self.cite_tool_name} with the chunk_ids of the results "
                "that support it, or with an empty list when nothing in the knowledge base supports it "
                "(including refusals and answers about the corpus itself, such as how many documents it holds).",
                "- Copy chunk ids verbatim, exactly as they appear in brackets in the results.",
                "- Never write chunk ids in the answer text.",
                "- Pictures labelled as knowledge-base pictures were retrieved from the corpus; pictures the "
                "user attached are part of the question.",
                "- Once you are told that a tool's budget is spent, stop calling it.",
            ]
        )
        return f"{self.instructions_preamble}\n\n{body}" if self.instructions_preamble else body

    # --- the cite tool (E10, E11) ---------------------------------------------------------------

    def cite_description(self) -> str:
        return (
            "Declare what grounds your answer: the chunk_ids of the supporting results, copied exactly, "
            "or an empty list when nothing in the knowledge base supports it."
        )

    async def cite(self, ctx: RunContext[Any], chunk_ids: list[str]) -> str:
        """E10. A declaration is recorded only once some id resolves, otherwise invalid ids alone
        would make an answer look grounded."""
        state = self.run_state()
        found = results_by_chunk_id(state.working_set)
        known = list(found)
        if not chunk_ids:
            state.evidence.declare([], epoch=self.epoch, retrieved_now=known)
            return CITE_NONE_ACK
        wanted = list(dict.fromkeys(repair_chunk_id(c, known) for c in map(normalise_chunk_id, chunk_ids) if c))
        resolved = {c: citation_for(found[c], c) for c in wanted if c in found}
        resolved |= await self.citations_from_store([c for c in wanted if c not in resolved])
        skipped = [c for c in wanted if c not in resolved]
        if not resolved:
            raise ModelRetry(no_citation_message(skipped))
        citations = [resolved[c] for c in wanted if c in resolved]
        register_citations(state.citation_index, state.citations, citations)
        refs = [EvidenceRef(capability=self.namespace, chunk_id=c.chunk_id) for c in citations]
        state.evidence.declare(refs, epoch=self.epoch, retrieved_now=known)
        return cite_ack(len(citations), skipped)

    async def citations_from_store(self, chunk_ids: Sequence[str]) -> dict[str, Citation]:
        """E10.4. Lets an id shown in the capsule be cited directly; one document lookup per
        distinct document."""
        documents: dict[str, Document | None] = {}
        out: dict[str, Citation] = {}
        for chunk_id in chunk_ids:
            chunk = await self.with_store(lambda store: store.get_chunk(chunk_id))
            if chunk is None:
                continue
            if chunk.document_id not in documents:
                documents[chunk.document_id] = await self.with_store(
                    lambda store: store.get_document(chunk.document_id)
                )
            document = documents[chunk.document_id]
            if document is not None:
                out[chunk_id] = Citation.from_chunk(chunk, document)
        return out

    # --- helpers for the concrete tools ---------------------------------------------------------

    def run_state(self) -> EvidenceState:
        if self.state is None:
            raise RuntimeError(
                f"{self.id}: only the run instance returned by for_run holds evidence; "
                "the registered capability never does (E2)"
            )
        return self.state

    def own_tool_names(self) -> frozenset[str]:
        return self.evidence_tool_names() | {self.cite_tool_name}

    def spend(self, tool_name: str, refusal: str) -> None:
        """E6.1. The count grows with every call, refused ones included; a spent tool stays
        declared and fails (E13)."""
        self.uses[tool_name] = self.uses.get(tool_name, 0) + 1
        if self.uses[tool_name] > self.tool_budgets()[tool_name]:
            raise ToolFailed(refusal)

    def budget_notice(self) -> str | None:
        """E14 from the current counters."""
        spent = spent_tools(self.uses, self.tool_budgets())
        return budget_notice(
            self.namespace,
            cite_tool=self.cite_tool_name,
            cite_available=self.cite_available,
            limit_reached=limit_reached(self.request_count, self.request_limit),
            spent=spent,
            unspent=[t for t in self.tool_budgets() if t not in spent],
        )

    def note_evidence(self) -> None:
        """E4. Stamped with the epoch of the request whose response issued the call (L4)."""
        self.run_state().evidence.note_evidence(self.epoch)

    def remember(self, key: str, results: Sequence[RetrievedChunk]) -> None:
        """E6.4/E8. What this question retrieved, for citing and for L9's `retrieved_now`."""
        working_set = self.run_state().working_set
        working_set[key] = merge_results(working_set.get(key, []), results)

    def with_pictures(self, text: str, results: Sequence[RetrievedChunk]) -> str | ToolReturn:
        """E6.6/E15. Pictures go in the return's user content, each after its signed label."""
        if not self.vision:
            return text
        content: list[str | BinaryContent] = picture_content_for(results, signer=self.signer, capability=self.namespace)
        return ToolReturn(return_value=text, content=content) if content else text

    def sync(self) -> None:
        """L12. The whole state, as JSON, under our own namespace only (L11)."""
        if self.host is not None and self.state is not None:
            self.host[self.namespace] = self.state.model_dump(mode="json")

    # --- the store (E3) -------------------------------------------------------------------------

    async def with_store(self, use: Callable[[CorpusStore], Awaitable[T]]) -> T:
        """E3. Opened lazily on first use and reused for the run; calls are serialised."""
        if self.lock is None:
            raise RuntimeError(f"{self.id}: the store is reached only through a run instance (E3)")
        async with self.lock:
            if self.connection is None:
                self.connection = await self._open_store()
            return await use(self.connection)

    async def _open_store(self) -> CorpusStore:
        store = self.store
        if self.store_lent:
            return cast(CorpusStore, store)
        opened = cast(StoreFactory, store)()  # __post_init__ accepted only a store or a callable
        return await opened if inspect.isawaitable(opened) else opened

    async def close_owned_store(self) -> None:
        """E3. A store lent by the host is the host's to close."""
        connection, self.connection = self.connection, None
        if connection is not None and not self.store_lent:
            await connection.close()
