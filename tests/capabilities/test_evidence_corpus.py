"""Evidence capabilities end to end over the real SQLite corpus, built by `ingest` from the fixtures."""

from __future__ import annotations

import re
import sqlite3
from functools import partial
from pathlib import Path

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, UserPromptPart
from pydantic_ai.models.function import AgentInfo

from capabilities.citing import cite_ack
from capabilities.corpus import SQLiteCorpus, ingest
from capabilities.ledger import citation_status
from capabilities.passages import PassagesState, create_passages
from capabilities.reader import ReaderState, create_reader
from capabilities.tags import is_our_picture
from tests.harness import (
    FIXTURES,
    PNG,
    SIGNER,
    Deps,
    ScriptedModel,
    call,
    pc,
    ps,
    respond,
    tool_returns,
)

ID_LINE = re.compile(r"^\[([^\]]+)\] \[rank 1 of \d+\]", re.MULTILINE)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.db"
    ingest(path, [FIXTURES / "corpus"])
    return path


def first_result_id(messages: list[ModelMessage]) -> str:
    match = ID_LINE.search(str(tool_returns(messages)[-1].content))
    assert match, "the last tool return shows no result block"
    return match.group(1)


def cite_first(tool: str, damage=lambda chunk_id: chunk_id):
    def turn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return respond(call(tool, {"chunk_ids": [damage(first_result_id(messages))]}, f"{tool}-1"))

    return turn


async def test_E6_E10_E15_search_cite_and_pictures_over_an_owned_sqlite_corpus(db):
    deps = Deps()
    opened: list[SQLiteCorpus] = []

    def open_store() -> SQLiteCorpus:
        opened.append(SQLiteCorpus(db))
        return opened[-1]

    model = ScriptedModel([respond(ps("brass refractor lens")), cite_first("passages_cite"), respond("150 mm")])
    agent = Agent(model, capabilities=[create_passages(open_store, SIGNER, vision=True)], deps_type=Deps)
    await agent.run("How big is the refractor lens?", deps=deps)

    request = model.wire(2)[-1]
    label, image = [p for p in request.parts if isinstance(p, UserPromptPart)][0].content
    assert image.data == PNG and is_our_picture(SIGNER, label, image)
    state = PassagesState.model_validate(deps.state["passages"])
    assert citation_status([state.evidence], question=0) == "grounded"
    (cited,) = state.citations
    citation = state.citation_index[cited]
    assert "150 mm lens" in citation.content
    assert citation.picture_refs == ["#/pictures/0"]
    assert citation.document_title == "Oakridge Observatory Handbook"
    assert len(citation.chunk_ids) > 1
    assert len(opened) == 1
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        await opened[0].search("lens", limit=1, filter=None)


async def test_E10_R24_a_damaged_real_chunk_id_is_repaired(db):
    deps = Deps()
    store = SQLiteCorpus(db)
    model = ScriptedModel([respond(ps("Safety Rules red torches")), cite_first("passages_cite", lambda c: c[:-1]),
                           respond("Red torches only.")])
    await Agent(model, capabilities=[create_passages(store, SIGNER)], deps_type=Deps).run("Lights?", deps=deps)
    assert tool_returns(model.wire(3))[-1].content == cite_ack(1)
    state = PassagesState.model_validate(deps.state["passages"])
    assert state.citations == [first_result_id(model.wire(2))]
    await store.close()


async def test_E7_E8_list_read_and_cite_over_the_sqlite_corpus(db):
    deps = Deps()
    store = SQLiteCorpus(db)
    documents = await store.list_documents(filter=None, offset=0, limit=50)
    handbook = next(d for d in documents if d.title == "Oakridge Observatory Handbook")

    def read_handbook(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        assert f"[{handbook.id}]" in str(tool_returns(messages)[-1].content)
        return respond(call("reader_read", {"document_id": handbook.id, "page": 2}, "rr1"))

    model = ScriptedModel([respond(call("reader_list_documents", {}, "rl1")), read_handbook,
                           cite_first("reader_cite"), respond("answer")])
    await Agent(model, capabilities=[create_reader(store, SIGNER)], deps_type=Deps).run("Safety?", deps=deps)
    state = ReaderState.model_validate(deps.state["reader"])
    assert list(state.working_set) == [f"read:{handbook.id}:2"]
    assert citation_status([state.evidence], question=0) == "grounded"
    (cited,) = state.citations
    assert state.evidence.occurrences[cited].retrieved_in_questions == [0]
    assert 2 in state.citation_index[cited].page_numbers
    await store.close()


async def test_E10e_a_chunk_from_an_earlier_question_is_cited_through_the_store(db):
    deps = Deps()
    store = SQLiteCorpus(db)
    [hit] = await store.search("winter map Orion", limit=1, filter=None)
    model = ScriptedModel([respond(pc(hit.chunk_id)), respond("Orion")])
    await Agent(model, capabilities=[create_passages(store, SIGNER)], deps_type=Deps).run("Winter sky?", deps=deps)
    state = PassagesState.model_validate(deps.state["passages"])
    assert citation_status([state.evidence], question=0) == "grounded"
    assert state.evidence.occurrences[hit.chunk_id].retrieved_in_questions == []
    assert "Orion" in state.citation_index[hit.chunk_id].content
    await store.close()


async def test_E16_picture_bytes_are_fetched_from_the_sqlite_store(db):
    from pydantic_ai import RunContext
    from pydantic_ai.usage import RunUsage

    store = SQLiteCorpus(db)
    [hit] = await store.search("brass refractor", limit=1, filter=None)
    owner = await create_passages(partial(SQLiteCorpus, db), SIGNER).for_run(
        RunContext(deps=Deps(), model=ScriptedModel([]), usage=RunUsage(), prompt="q")
    )
    assert await owner.get_picture_bytes(hit.document_id, "#/pictures/0") == PNG
    assert await owner.get_picture_bytes(hit.document_id, "#/pictures/99") is None
    await owner.close_owned_store()
    await store.close()


async def test_E15_a_pdf_page_read_with_vision_attaches_that_pages_image_with_a_signed_label(tmp_path):
    from tests.documents import text_pdf

    manual = text_pdf(tmp_path / "manual.pdf")
    db = tmp_path / "pdf.db"
    ingest(db, [manual])
    store = SQLiteCorpus(db)
    [document] = await store.list_documents(filter=None, offset=0, limit=5)
    deps = Deps()
    model = ScriptedModel([respond(call("reader_read", {"document_id": document.id, "page": 2}, "rr1")),
                           cite_first("reader_cite"), respond("Every morning.")])
    agent = Agent(model, capabilities=[create_reader(store, SIGNER, vision=True)], deps_type=Deps)
    await agent.run("How often is the lens wiped?", deps=deps)
    label, image = [p for p in model.wire(2)[-1].parts if isinstance(p, UserPromptPart)][0].content
    assert image.media_type == "image/jpeg" and is_our_picture(SIGNER, label, image)
    assert image.data == await store.get_picture_bytes(document.id, "#/pictures/1")
    assert "#/pictures/1" in label
    state = ReaderState.model_validate(deps.state["reader"])
    citation = state.citation_index[state.citations[0]]
    assert citation.page_numbers == [2] and citation.picture_refs == ["#/pictures/1"]
    await store.close()
