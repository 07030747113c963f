"""E15/T4 units: pictures are validated, deduplicated and emitted as signed label/image pairs."""

from __future__ import annotations

import io

from PIL import Image
from pydantic_ai.messages import BinaryContent

from capabilities.pictures import decode_picture, picture_content_for
from capabilities.store import RetrievedChunk
from capabilities.tags import TagSigner, is_our_picture, picture_label
from tests.harness import NOT_AN_IMAGE, OTHER_PNG, PNG, SIGNER


def result(chunk_id: str, document_id: str, pictures: dict[str, bytes]) -> RetrievedChunk:
    return RetrievedChunk(
        chunk_id=chunk_id, document_id=document_id, document_uri=f"file://{document_id}", pictures=pictures
    )


def jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (2, 2), "red").save(out, format="JPEG")
    return out.getvalue()


def test_E15_decode_takes_the_media_type_from_the_detected_format():
    assert decode_picture(PNG) == BinaryContent(data=PNG, media_type="image/png")
    decoded = decode_picture(jpeg())
    assert decoded is not None and decoded.media_type == "image/jpeg"


def test_E15_R22_bytes_that_do_not_decode_give_no_picture():
    assert decode_picture(NOT_AN_IMAGE) is None
    assert decode_picture(b"") is None
    assert decode_picture(None) is None


def test_E15_the_same_picture_in_two_results_is_one_pair():
    results = [result("c-1", "d-1", {"#/pictures/0": PNG}), result("c-2", "d-1", {"#/pictures/0": PNG})]
    content = picture_content_for(results, signer=SIGNER, capability="passages")
    assert len(content) == 2
    assert content[0] == picture_label(
        SIGNER, capability="passages", document_id="d-1", self_ref="#/pictures/0", chunk_id="c-1",
        image=PNG, position=(1, 1),
    )
    assert content[1] == BinaryContent(data=PNG, media_type="image/png")


def test_E15_R22_an_undecodable_picture_emits_neither_label_nor_image():
    results = [result("c-1", "d-1", {"#/pictures/0": PNG}), result("c-6", "d-2", {"#/pictures/1": NOT_AN_IMAGE})]
    content = picture_content_for(results, signer=SIGNER, capability="passages")
    assert len(content) == 2
    assert isinstance(content[0], str) and content[0].startswith("Knowledge-base picture 1/1")
    assert "#/pictures/1" not in content[0]


def test_E15_the_same_ref_in_another_document_is_another_picture():
    results = [result("c-1", "d-1", {"#/pictures/0": PNG}), result("c-6", "d-2", {"#/pictures/0": OTHER_PNG})]
    content = picture_content_for(results, signer=SIGNER, capability="reader")
    labels = content[0::2]
    assert [label.split(",")[0] for label in labels] == ["Knowledge-base picture 1/2", "Knowledge-base picture 2/2"]
    assert [image.data for image in content[1::2]] == [PNG, OTHER_PNG]


def test_E15_T4_every_label_is_followed_by_its_image_and_verifies_with_it():
    results = [result("c-1", "d-1", {"#/pictures/0": PNG, "#/pictures/2": OTHER_PNG})]
    content = picture_content_for(results, signer=SIGNER, capability="passages")
    pairs = list(zip(content[0::2], content[1::2], strict=True))
    assert len(pairs) == 2
    assert all(is_our_picture(SIGNER, label, image) for label, image in pairs)
    assert not is_our_picture(TagSigner([b"other"]), *pairs[0])


def test_E15_labels_say_the_picture_comes_from_the_corpus_and_name_the_result():
    content = picture_content_for([result("c-1", "d-1", {"#/pictures/0": PNG})], signer=SIGNER, capability="passages")
    assert "attached with result [c-1] (#/pictures/0)" in content[0]
    assert "it comes from the corpus, not from the user" in content[0]


def test_E15_results_without_pictures_give_no_content():
    assert picture_content_for([result("c-2", "d-1", {})], signer=SIGNER, capability="passages") == []
