"""Part C, the capsule (C5, C6, C10): pure, built from discovery views without an agent."""

from __future__ import annotations

import pytest
from pydantic_ai.messages import BinaryContent

from capabilities.capsule import (
    CAPSULE_HEADER,
    Capsule,
    RetainedPicture,
    build_capsule,
    group_label,
)
from capabilities.evidence import DiscoveredEvidence
from capabilities.ledger import CapabilityEvidenceRecord, EvidenceOccurrence
from capabilities.store import Citation
from capabilities.tags import is_our_picture, picture_label
from tests.harness import PNG, SIGNER

TOOLS = {"passages": frozenset({"passages_search"}), "reader": frozenset({"reader_list_documents", "reader_read"})}


def cited(chunk_id: str, *questions: int, document_id: str = "d-1", pictures: tuple[str, ...] = (), **kw) -> tuple:
    """One occurrence cited in `questions`, with its Citation."""
    citation = Citation(
        index=None,
        document_id=document_id,
        chunk_id=chunk_id,
        chunk_ids=[chunk_id],
        document_uri=kw.pop("uri", f"file://{document_id}.md"),
        document_title=kw.pop("title", "Handbook"),
        content=kw.pop("content", f"content of {chunk_id}"),
        doc_item_refs=list(pictures),
        picture_refs=list(pictures),
    )
    return chunk_id, list(questions), citation


def view(capability: str, *entries: tuple, vision: bool = True, retrieved_only: tuple[str, ...] = ()):
    occurrences = {
        chunk_id: EvidenceOccurrence(
            capability=capability, chunk_id=chunk_id, cited_in_questions=qs, retrieved_in_questions=qs
        )
        for chunk_id, qs, _ in entries
    }
    for chunk_id in retrieved_only:
        occurrences[chunk_id] = EvidenceOccurrence(capability=capability, chunk_id=chunk_id, retrieved_in_questions=[2])
    return DiscoveredEvidence(
        capability=capability,
        record=CapabilityEvidenceRecord(occurrences=occurrences, question=12, in_progress=True),
        citations={chunk_id: citation for chunk_id, _, citation in entries},
        tool_names=TOOLS[capability],
        cite_tool=f"{capability}_cite",
        cite_available=True,
        state_carried=True,
        vision=vision,
    )


def test_C5_renders_header_groups_and_blocks_separated_by_blank_lines():
    capsule = build_capsule([view("passages", cited("c-1", 2, content="the text"))], boundary=4)
    assert capsule.text == "\n\n".join(
        [CAPSULE_HEADER, group_label(1), '[c-1] Source: "Handbook" (file://d-1.md)\nthe text']
    )


def test_C5a_newest_group_first():
    capsule = build_capsule([view("passages", cited("old", 2), cited("new", 8))], boundary=12)
    text = capsule.text
    assert text.index(group_label(1)) < text.index("[new]") < text.index(group_label(2)) < text.index("[old]")


def test_C5b_an_entry_joins_its_newest_citing_question_once():
    capsule = build_capsule([view("passages", cited("only-old", 2), cited("reused", 2, 8))], boundary=12)
    assert capsule.text.count("[reused]") == 1
    assert capsule.text.index("[reused]") < capsule.text.index(group_label(2)) < capsule.text.index("[only-old]")


def test_C5c_entries_cited_in_one_question_share_one_group():
    capsule = build_capsule([view("passages", cited("b", 4), cited("a", 4))], boundary=6)
    assert capsule.text.count("[Earlier citations") == 1
    assert group_label(1) in capsule.text and group_label(2) not in capsule.text
    assert capsule.text.index("[a]") < capsule.text.index("[b]")


def test_C5d_cited_content_is_kept_whole():
    long = "x" * 19_990 + "END-MARKER"
    capsule = build_capsule([view("passages", cited("big", 2, content=long))], boundary=4)
    assert long in capsule.text


def test_C5e_passages_and_reader_share_one_header():
    capsule = build_capsule(
        [view("passages", cited("p-1", 2)), view("reader", cited("r-1", 2))], boundary=4
    )
    assert capsule.text.count(CAPSULE_HEADER) == 1
    assert "[p-1]" in capsule.text and "[r-1]" in capsule.text


def test_C5f_R41_same_chunk_id_under_two_capabilities_is_kept_twice():
    capsule = build_capsule(
        [
            view("passages", cited("shared", 2, content="PASSAGES VERSION")),
            view("reader", cited("shared", 2, content="READER VERSION")),
        ],
        boundary=4,
    )
    assert capsule.text.count("[shared]") == 2
    assert "PASSAGES VERSION" in capsule.text and "READER VERSION" in capsule.text


def test_C5g_retrieved_but_never_cited_is_absent():
    capsule = build_capsule([view("passages", cited("c-1", 2), retrieved_only=("c-2",))], boundary=4)
    assert "[c-1]" in capsule.text and "[c-2]" not in capsule.text


def test_C5g_nothing_cited_gives_an_empty_capsule():
    assert build_capsule([view("passages", retrieved_only=("c-2",))], boundary=4) == Capsule(text="", pictures=())
    assert build_capsule([], boundary=4) == Capsule(text="")


def test_C5h_R38_title_equal_to_uri_is_named_once():
    capsule = build_capsule(
        [view("passages", cited("c-1", 2, title="2410.11843v5", uri="2410.11843v5"))], boundary=4
    )
    assert 'Source: "2410.11843v5"\n' in capsule.text
    assert "(2410.11843v5)" not in capsule.text


def test_C5h_no_title_uses_the_uri_alone():
    capsule = build_capsule([view("passages", cited("c-1", 2, title=None, uri="file://x.md"))], boundary=4)
    assert '[c-1] Source: "file://x.md"\n' in capsule.text


def test_C5i_current_question_citations_are_excluded():
    capsule = build_capsule([view("passages", cited("c-7", 6), cited("c-1", 2))], boundary=6)
    assert "[c-1]" in capsule.text and "[c-7]" not in capsule.text


def test_C6_R43_cited_occurrence_without_citation_raises():
    found = view("passages", cited("c-1", 2))
    found.record.occurrences["absent"] = EvidenceOccurrence(
        capability="passages", chunk_id="absent", cited_in_questions=[4]
    )
    with pytest.raises(ValueError, match="absent") as raised:
        build_capsule([found], boundary=6)
    assert "passages" in str(raised.value)


def refs(capsule: Capsule) -> list[tuple[str, str, str, str]]:
    return [(p.capability, p.chunk_id, p.document_id, p.self_ref) for p in capsule.pictures]


def test_C10a_pictures_follow_capsule_order():
    capsule = build_capsule(
        [
            view(
                "passages",
                cited("a", 2, document_id="doc-of-a", pictures=("#/pictures/0",)),
                cited("c", 6, document_id="doc-of-c", pictures=("#/pictures/1", "#/pictures/2")),
            )
        ],
        boundary=8,
    )
    assert refs(capsule) == [
        ("passages", "c", "doc-of-c", "#/pictures/1"),
        ("passages", "c", "doc-of-c", "#/pictures/2"),
        ("passages", "a", "doc-of-a", "#/pictures/0"),
    ]


def test_C10b_R40_one_figure_through_two_chunks_is_retained_once_for_the_first():
    capsule = build_capsule(
        [
            view(
                "passages",
                cited("first", 2, pictures=("#/pictures/1",)),
                cited("second", 2, pictures=("#/pictures/1",)),
            )
        ],
        boundary=4,
    )
    assert refs(capsule) == [("passages", "first", "d-1", "#/pictures/1")]


def test_C10c_R40_same_ref_in_two_documents_is_two_pictures():
    capsule = build_capsule(
        [
            view(
                "passages",
                cited("a", 2, document_id="d-1", pictures=("#/pictures/0",)),
                cited("b", 2, document_id="d-2", pictures=("#/pictures/0",)),
            )
        ],
        boundary=4,
    )
    assert refs(capsule) == [("passages", "a", "d-1", "#/pictures/0"), ("passages", "b", "d-2", "#/pictures/0")]


def test_C10_same_ref_under_two_capabilities_is_two_pictures():
    capsule = build_capsule(
        [
            view("passages", cited("a", 2, pictures=("#/pictures/0",))),
            view("reader", cited("b", 2, pictures=("#/pictures/0",))),
        ],
        boundary=4,
    )
    assert refs(capsule) == [("passages", "a", "d-1", "#/pictures/0"), ("reader", "b", "d-1", "#/pictures/0")]


def test_C10d_an_uncited_chunks_picture_is_absent():
    found = view("passages", cited("a", 2))
    found.record.occurrences["u"] = EvidenceOccurrence(capability="passages", chunk_id="u", retrieved_in_questions=[2])
    found.citations["u"] = cited("u", document_id="d-1", pictures=("#/pictures/0",))[2]
    assert build_capsule([found], boundary=4).pictures == ()


def test_C10e_R36_owner_without_vision_contributes_no_pictures():
    capsule = build_capsule(
        [
            view("passages", cited("a", 2, pictures=("#/pictures/0",)), vision=False),
            view("reader", cited("b", 2, pictures=("#/pictures/3",)), vision=True),
        ],
        boundary=4,
    )
    assert "[a]" in capsule.text
    assert refs(capsule) == [("reader", "b", "d-1", "#/pictures/3")]


def test_C11_retained_label_is_the_cited_variant_and_verifies_with_its_image():
    picture = RetainedPicture("passages", "c-1", "d-1", "#/pictures/0")
    label = picture.label(SIGNER, PNG)
    assert label == picture_label(
        SIGNER, capability="passages", document_id="d-1", self_ref="#/pictures/0", chunk_id="c-1", image=PNG, cited=True
    )
    assert is_our_picture(SIGNER, label, BinaryContent(data=PNG, media_type="image/png"))
