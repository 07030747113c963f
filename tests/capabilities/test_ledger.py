"""Part L, pure: the evidence record, declarations and citation status (no agent)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capabilities.ledger import (
    ALREADY_ANSWERED,
    APPEND_ONLY,
    NO_IDENTITY,
    CapabilityEvidenceRecord,
    CitationDeclaration,
    EvidenceRef,
    citation_status,
)


def ref(chunk_id: str, capability: str = "passages") -> EvidenceRef:
    return EvidenceRef(capability=capability, chunk_id=chunk_id)


def record_at(question: int, **fields) -> CapabilityEvidenceRecord:
    return CapabilityEvidenceRecord(question=question, in_progress=True, **fields)


# --- L5 begin_question -------------------------------------------------------------------------


@pytest.mark.parametrize("identity", [4, 3])
def test_L5_begin_question_refuses_an_equal_or_smaller_identity(identity):
    record = record_at(4)
    with pytest.raises(ValueError, match=ALREADY_ANSWERED):
        record.begin_question(identity)
    assert record.question == 4


def test_L5_begin_question_clears_epochs_and_the_declaration_but_keeps_occurrences():
    record = record_at(4)
    record.note_evidence(6)
    record.declare([ref("c-1")], epoch=7, retrieved_now={"c-1"})
    record.begin_question(9)
    assert record.question == 9
    assert record.in_progress is True
    assert record.latest_evidence_epoch == 0
    assert record.declaration is None
    assert citation_status([record], question=9) == "missing"
    assert record.occurrences["c-1"].cited_in_questions == [4]


def test_L5_R12_epochs_do_not_constrain_a_new_identity():
    record = CapabilityEvidenceRecord(question=0, latest_evidence_epoch=9)
    record.begin_question(4)
    assert record.question == 4
    assert record.latest_evidence_epoch == 0


def test_L5_R11_the_last_questions_declaration_does_not_ground_the_next():
    record = record_at(0)
    record.declare([ref("c-1")], epoch=3)
    record.end_question()
    record.begin_question(4)
    assert citation_status([record], question=4) == "missing"


# --- L6 end_question ---------------------------------------------------------------------------


def test_L6_end_question_clears_only_in_progress():
    record = record_at(2)
    record.note_evidence(3)
    record.end_question()
    assert record.in_progress is False
    assert (record.question, record.latest_evidence_epoch) == (2, 3)


# --- L7 append-only ----------------------------------------------------------------------------


def test_L7_note_evidence_refuses_an_earlier_epoch():
    record = record_at(0)
    record.note_evidence(9)
    with pytest.raises(ValueError, match=APPEND_ONLY):
        record.note_evidence(4)
    assert record.latest_evidence_epoch == 9


def test_L7_declare_refuses_an_earlier_epoch_and_keeps_the_newer_refs():
    record = record_at(0)
    record.declare([ref("c-1")], epoch=5)
    with pytest.raises(ValueError, match=APPEND_ONLY):
        record.declare([ref("c-2")], epoch=3)
    assert record.declaration is not None
    assert record.declaration.refs == [ref("c-1")]


def test_L7_note_evidence_refuses_an_epoch_below_the_declaration():
    record = record_at(0)
    record.declare([ref("c-1")], epoch=5)
    with pytest.raises(ValueError, match=APPEND_ONLY):
        record.note_evidence(3)
    assert record.latest_evidence_epoch == 0


def test_L7_note_evidence_refuses_an_epoch_below_the_question():
    record = record_at(6)
    with pytest.raises(ValueError, match=APPEND_ONLY):
        record.note_evidence(5)


# --- L8/L9 declare -----------------------------------------------------------------------------


def test_L8_note_evidence_sets_the_latest_epoch():
    record = record_at(0)
    record.note_evidence(3)
    assert record.latest_evidence_epoch == 3


def test_L9_declare_needs_a_question_identity():
    record = CapabilityEvidenceRecord()
    with pytest.raises(ValueError, match=NO_IDENTITY):
        record.declare([ref("c-1")], epoch=1)
    assert record.declaration is None


def test_L9a_R10_a_later_empty_cite_does_not_downgrade_a_grounding():
    record = record_at(0)
    record.declare([ref("c1")], epoch=3)
    record.declare([], epoch=5)
    assert citation_status([record], question=0) == "grounded"
    assert record.declaration == CitationDeclaration(question=0, epoch=5, refs=[ref("c1")])


def test_L9b_refs_after_an_empty_declaration_ground_it():
    record = record_at(0)
    record.declare([], epoch=3)
    record.declare([ref("c1")], epoch=3)
    assert citation_status([record], question=0) == "grounded"


def test_L9c_new_evidence_makes_the_next_declaration_replace():
    record = record_at(0)
    record.declare([ref("first")], epoch=3)
    record.note_evidence(4)
    record.declare([ref("second")], epoch=5)
    assert record.declaration is not None
    assert record.declaration.refs == [ref("second")]


def test_L9d_an_empty_declaration_after_new_evidence_is_ungrounded():
    record = record_at(0)
    record.declare([ref("c1")], epoch=3)
    record.note_evidence(4)
    record.declare([], epoch=5)
    assert citation_status([record], question=0) == "ungrounded"


def test_L9e_the_same_ref_twice_is_declared_once():
    record = record_at(0)
    record.declare([ref("c1"), ref("c1")], epoch=3)
    record.declare([ref("c1")], epoch=3)
    assert record.declaration is not None
    assert record.declaration.refs == [ref("c1")]


def test_L9f_occurrences_record_citing_and_retrieving_questions():
    record = record_at(2)
    record.declare([ref("c1")], epoch=3, retrieved_now={"c1"})
    record.end_question()
    record.begin_question(8)
    record.declare([ref("c1")], epoch=9)
    occurrence = record.occurrences["c1"]
    assert occurrence.cited_in_questions == [2, 8]
    assert occurrence.retrieved_in_questions == [2]


# --- L10 citation_status -----------------------------------------------------------------------


def test_L10a_a_declaration_in_the_same_request_as_evidence_is_not_current():
    record = record_at(0)
    record.note_evidence(5)
    record.declare([ref("c1")], epoch=5)
    assert citation_status([record], question=0) == "missing"
    record.declare([ref("c1")], epoch=7)
    assert citation_status([record], question=0) == "grounded"


def test_L10b_evidence_in_another_record_makes_a_declaration_stale():
    passages = record_at(0)
    passages.note_evidence(3)
    passages.declare([ref("c1")], epoch=5)
    reader = record_at(0)
    reader.note_evidence(7)
    assert citation_status([passages, reader], question=0) == "missing"
    assert citation_status([passages], question=0) == "grounded"


def test_L10c_no_records_is_missing():
    assert citation_status([], question=0) == "missing"


def test_L10_a_declaration_for_another_question_is_not_current():
    record = record_at(0)
    record.declare([ref("c1")], epoch=3)
    assert citation_status([record], question=4) == "missing"


# --- L11 single writer -------------------------------------------------------------------------


def test_L11_R41_the_same_chunk_under_two_capabilities_is_two_occurrences_surviving_json():
    passages = record_at(0)
    passages.declare([ref("shared", "passages")], epoch=2)
    reader = record_at(0)
    reader.declare([ref("shared", "reader")], epoch=2)
    reloaded = [CapabilityEvidenceRecord.model_validate_json(r.model_dump_json()) for r in (passages, reader)]
    occurrences = [r.occurrences["shared"] for r in reloaded]
    assert [o.capability for o in occurrences] == ["passages", "reader"]
    assert all(o.cited_in_questions == [0] for o in occurrences)


# --- properties (hypothesis) -------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("begin"), st.integers(0, 40)),
        st.tuples(st.just("end"), st.just(0)),
        st.tuples(st.just("note"), st.integers(0, 40)),
        st.tuples(st.just("declare"), st.integers(0, 40), st.lists(st.sampled_from(["a", "b", "c"]), max_size=3)),
    ),
    max_size=25,
)


def apply(record: CapabilityEvidenceRecord, op: tuple) -> bool:
    """Apply one operation; False when the record refused it (a ValueError)."""
    try:
        match op:
            case ("begin", identity):
                record.begin_question(identity)
            case ("end", _):
                record.end_question()
            case ("note", epoch):
                record.note_evidence(epoch)
            case ("declare", epoch, ids):
                record.declare([ref(i) for i in ids], epoch=epoch, retrieved_now=ids[:1])
    except ValueError:
        return False
    return True


@given(ops)
def test_L5_property_identities_only_grow(operations):
    record = CapabilityEvidenceRecord()
    seen: list[int] = []
    for op in operations:
        apply(record, op)
        if record.question is not None:
            seen.append(record.question)
    assert seen == sorted(seen)


@given(ops)
def test_L7_property_a_refused_operation_leaves_the_record_unchanged(operations):
    record = CapabilityEvidenceRecord()
    for op in operations:
        before = record.model_copy(deep=True)
        if not apply(record, op):
            assert record == before


@given(ops)
def test_L10_property_current_only_for_its_question_and_past_every_newest_outcome(operations):
    record = CapabilityEvidenceRecord()
    other = CapabilityEvidenceRecord(question=0, in_progress=True)
    for op in operations:
        apply(record, op)
    if record.question is None:
        return
    q = record.question
    status = citation_status([record], question=q)
    d = record.declaration
    current = d is not None and d.question == q and d.epoch > record.latest_evidence_epoch
    assert (status != "missing") == current
    if current:
        assert status == ("grounded" if d.refs else "ungrounded")
    assert citation_status([record], question=q + 1) == "missing"
    if d is not None:
        other.note_evidence(d.epoch)
        assert citation_status([record, other], question=q) == "missing"


@given(ops)
def test_L10_property_status_is_derived_never_stored(operations):
    record = CapabilityEvidenceRecord()
    for op in operations:
        apply(record, op)
    dumped = record.model_dump(mode="json")
    assert "status" not in dumped and "citation_status" not in dumped
    assert set(dumped) == {"occurrences", "question", "in_progress", "latest_evidence_epoch", "declaration"}


@given(ops)
def test_R32_property_records_survive_a_json_round_trip(operations):
    record = CapabilityEvidenceRecord()
    for op in operations:
        apply(record, op)
    reloaded = CapabilityEvidenceRecord.model_validate_json(record.model_dump_json())
    assert reloaded == record
    assert reloaded.model_dump(mode="json") == record.model_dump(mode="json")
