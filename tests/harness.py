"""The shared test harness (docs/design/architecture.md, "tests/"): ScriptedModel, FakeCorpus, Deps, SIGNER.

Scenarios script the model's responses in order; every request the model receives (the wire)
is recorded so tests can assert on exactly what the model saw.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from capabilities.store import Chunk, Document, RetrievedChunk, retrieved_from_chunk
from capabilities.tags import TagSigner

FIXTURES = Path(__file__).parent / "fixtures"
PNG = (FIXTURES / "pixel.png").read_bytes()
OTHER_PNG = (FIXTURES / "square.png").read_bytes()
NOT_AN_IMAGE = (FIXTURES / "not-an-image.png").read_bytes()

SIGNER = TagSigner([b"test-key"])

Turn = ModelResponse | Callable[[list[ModelMessage], AgentInfo], ModelResponse]


class ScriptOverrun(AssertionError):
    """The model was asked for more responses than the scenario scripted."""


class ScriptedModel(FunctionModel):
    """Returns the scripted responses in order and records every wire and `AgentInfo`."""

    def __init__(self, turns: Sequence[Turn], *, model_name: str = "scripted") -> None:
        self.turns = list(turns)
        self.wires: list[list[ModelMessage]] = []
        self.infos: list[AgentInfo] = []
        super().__init__(self._respond, model_name=model_name)

    def _respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.wires.append(copy.deepcopy(messages))
        self.infos.append(info)
        k = len(self.wires)
        if k > len(self.turns):
            raise ScriptOverrun(f"the model was called {k} times but only {len(self.turns)} turns are scripted")
        turn = self.turns[k - 1]
        return turn(messages, info) if callable(turn) else turn

    def wire(self, k: int) -> list[ModelMessage]:
        """The messages the model received on its k-th call (1-based, as in the spec)."""
        return self.wires[k - 1]

    def offered(self, k: int) -> set[str]:
        """Names of the function tools offered on the k-th call."""
        return {t.name for t in self.infos[k - 1].function_tools}

    def instructions(self, k: int) -> str:
        """The instructions of the k-th request, per-request notices included."""
        return self.infos[k - 1].instructions or ""


def call(tool: str, args: dict[str, Any] | None = None, call_id: str | None = None) -> ToolCallPart:
    return ToolCallPart(tool_name=tool, args=args or {}, tool_call_id=call_id or f"call-{tool}")


def respond(*parts: ToolCallPart | str) -> ModelResponse:
    """`M` in the scenario notation: text and/or tool calls, in order."""
    return ModelResponse(parts=[TextPart(p) if isinstance(p, str) else p for p in parts])


def ps(query: str = "q", call_id: str = "ps1", **kw: Any) -> ToolCallPart:
    return call("passages_search", {"query": query, **kw}, call_id)


def pc(*chunk_ids: str, call_id: str = "pc1") -> ToolCallPart:
    return call("passages_cite", {"chunk_ids": list(chunk_ids)}, call_id)


def tool_returns(messages: Sequence[ModelMessage]) -> list[ToolReturnPart]:
    return [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]


def user_texts(messages: Sequence[ModelMessage]) -> list[str]:
    """Every str item of every UserPromptPart, in order."""
    out: list[str] = []
    for m in messages:
        if isinstance(m, ModelRequest):
            for p in m.parts:
                if isinstance(p, UserPromptPart):
                    items = [p.content] if isinstance(p.content, str) else p.content
                    out += [i for i in items if isinstance(i, str)]
    return out


@dataclass
class Deps:
    """The harness deps: a state dict and conversation id `conv-1`."""

    state: dict[str, Any] = field(default_factory=dict)
    conversation_id: str = "conv-1"


@dataclass
class StatelessDeps:
    """A host that carries no state at all (L15, P12)."""

    conversation_id: str = "conv-1"


class FakeCorpus:
    """An in-memory CorpusStore with deterministic ids.

    Documents `d-1`, `d-2`; chunks `c-1`..`c-9` (c-1..c-5 in d-1, c-6..c-9 in d-2, one per page);
    `#/pictures/0` in d-1 is a valid PNG referenced by c-1, `#/pictures/1` in d-2 does not decode
    and is referenced by c-6. `results_for[query]` fixes what a search returns; otherwise a chunk
    matches when it contains a query word. `picture_mode` is "ok", "none" or "raise".
    """

    def __init__(self) -> None:
        self.documents = {
            "d-1": Document(id="d-1", uri="file://d-1.md", title="Handbook", meta={"lang": "en"}, page_count=5),
            "d-2": Document(id="d-2", uri="file://d-2.md", title="Guide", page_count=4),
        }
        self.chunks: dict[str, Chunk] = {}
        for i in range(1, 10):
            doc = "d-1" if i <= 5 else "d-2"
            page = i if i <= 5 else i - 5
            refs = {1: ["#/texts/1", "#/pictures/0"], 6: ["#/pictures/1"]}.get(i, [f"#/texts/{i}"])
            self.chunks[f"c-{i}"] = Chunk(
                id=f"c-{i}",
                document_id=doc,
                ordinal=page,
                content=f"chunk {i} content about topic{i} and masks",
                headings=[f"Section {i}"],
                page_numbers=[page],
                labels=["text"],
                doc_item_refs=refs,
                picture_captions={r: f"Figure {i}" for r in refs if r.startswith("#/pictures/")},
            )
        self.pictures: dict[tuple[str, str], bytes] = {("d-1", "#/pictures/0"): PNG, ("d-2", "#/pictures/1"): NOT_AN_IMAGE}
        self.results_for: dict[str, list[str]] = {}
        self.picture_mode = "ok"
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.closed = 0

    def add_chunk(self, chunk: Chunk) -> None:
        self.chunks[chunk.id] = chunk

    def _result(self, chunk: Chunk, score: float = 1.0) -> RetrievedChunk:
        result = retrieved_from_chunk(chunk, self.documents[chunk.document_id], score=score)
        for ref in chunk.doc_item_refs:
            data = self.pictures.get((chunk.document_id, ref))
            if data is not None:
                result.pictures[ref] = data
        return result

    async def search(self, query: str, *, limit: int, filter: str | None) -> list[RetrievedChunk]:
        self.calls.append(("search", (query, limit, filter)))
        if query in self.results_for:
            ids = self.results_for[query]
        else:
            words = {w.lower() for w in query.split()}
            ids = [cid for cid, c in self.chunks.items() if words & set(c.content.lower().split())]
        hits = [self.chunks[i] for i in ids if filter is None or self.chunks[i].document_id == filter]
        return [self._result(c) for c in hits[:limit]]

    async def expand_context(self, results: list[RetrievedChunk]) -> list[RetrievedChunk]:
        self.calls.append(("expand_context", (len(results),)))
        return results

    async def get_chunk(self, chunk_id: str) -> Chunk | None:
        self.calls.append(("get_chunk", (chunk_id,)))
        return self.chunks.get(chunk_id)

    async def get_document(self, document_id: str) -> Document | None:
        self.calls.append(("get_document", (document_id,)))
        return self.documents.get(document_id)

    async def list_documents(self, *, filter: str | None, offset: int, limit: int) -> list[Document]:
        self.calls.append(("list_documents", (filter, offset, limit)))
        docs = [d for d in self.documents.values() if filter is None or d.id == filter]
        return docs[offset : offset + limit]

    async def read(
        self, document_id: str, *, page: int | None, section: str | None, filter: str | None
    ) -> list[RetrievedChunk] | None:
        self.calls.append(("read", (document_id, page, section, filter)))
        if document_id not in self.documents or (filter is not None and document_id != filter):
            return None
        chunks = [c for c in self.chunks.values() if c.document_id == document_id]
        if page is not None:
            if not 1 <= page <= self.documents[document_id].page_count:
                return None
            chunks = [c for c in chunks if page in c.page_numbers]
        elif section is not None:
            chunks = [c for c in chunks if section in c.headings]
            if not chunks:
                return None
        else:
            chunks = chunks[:1]
        return [self._result(c) for c in chunks]

    async def get_picture_bytes(self, document_id: str, self_ref: str) -> bytes | None:
        self.calls.append(("get_picture_bytes", (document_id, self_ref)))
        if self.picture_mode == "raise":
            raise OSError("picture store unavailable")
        if self.picture_mode == "none":
            return None
        return self.pictures.get((document_id, self_ref))

    async def close(self) -> None:
        self.closed += 1

    def count(self, name: str) -> int:
        return sum(1 for n, _ in self.calls if n == name)
