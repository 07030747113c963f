"""Signed machine tags for our pictures and our redirect (Part T).

Prose can be typed by anyone and position is ambiguous when several tools share one request
(F12), so the only thing that marks content as ours is an HMAC that a user, a document or a
client-supplied history cannot produce.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence
from urllib.parse import quote, unquote

from pydantic_ai.messages import BinaryContent

_SAFE = "/#:-._"
_SIG = r"[0-9a-f]{32}"
_PICTURE_TAG = re.compile(rf"\[evidence-image v1 cap=(\S+?) doc=(\S+?) ref=(\S+?) sig=({_SIG})\]")
_REDIRECT_TAG = re.compile(rf"\[cite-request v1 q=(\d+) sig=({_SIG})\]")
_ANY_TAG = re.compile(r"\[(?:evidence-image|cite-request) v1\b")


def _encode(value: str) -> str:
    return quote(value, safe=_SAFE)


class TagSigner:
    """T1. Signs with the newest key and verifies with any: keys rotate, and stored histories
    outlive a deploy, so an older key must keep verifying until it is retired."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError("TagSigner needs at least one key (GROUNDED_TAG_KEYS, newest first)")
        self.keys = tuple(keys)

    def __repr__(self) -> str:
        return f"TagSigner(<{len(self.keys)} key(s)>)"

    @staticmethod
    def _message(fields: Sequence[str]) -> bytes:
        return "|".join(_encode(f) for f in fields).encode()

    def sign(self, *fields: str) -> str:
        return hmac.new(self.keys[0], self._message(fields), hashlib.sha256).hexdigest()[:32]

    def verifies(self, signature: str, *fields: str) -> bool:
        """Any listed key may have signed it (rotation); compared in constant time."""
        message = self._message(fields)
        return any(
            hmac.compare_digest(signature, hmac.new(key, message, hashlib.sha256).hexdigest()[:32])
            for key in self.keys
        )


def _image_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def picture_tag(signer: TagSigner, *, capability: str, document_id: str, self_ref: str, image: bytes) -> str:
    """T2. The signature binds the image digest, so our label above another picture is not ours."""
    sig = signer.sign("evidence-image", "v1", capability, document_id, self_ref, _image_digest(image))
    return (
        f"[evidence-image v1 cap={_encode(capability)} doc={_encode(document_id)} "
        f"ref={_encode(self_ref)} sig={sig}]"
    )


def picture_label(
    signer: TagSigner,
    *,
    capability: str,
    document_id: str,
    self_ref: str,
    chunk_id: str,
    image: bytes,
    position: tuple[int, int] | None = None,
    cited: bool = False,
) -> str:
    """E15/C11. Tool-attached pictures arrive in a user-role part: without the label the model
    takes them for the user's own, and the label is the only place it can read which chunk to cite."""
    if cited:
        head = f"Knowledge-base picture for cited evidence [{chunk_id}] ({self_ref})"
    elif position is not None:
        head = f"Knowledge-base picture {position[0]}/{position[1]}, attached with result [{chunk_id}] ({self_ref})"
    else:
        head = f"Knowledge-base picture attached with result [{chunk_id}] ({self_ref})"
    tag = picture_tag(signer, capability=capability, document_id=document_id, self_ref=self_ref, image=image)
    return f"{head}; it comes from the corpus, not from the user. {tag}"


def is_our_picture(signer: TagSigner, label_item: object, next_item: object) -> bool:
    """T2. Both halves are needed: a lone tag is just text, and an unlabelled image may be the user's."""
    if not isinstance(label_item, str) or not isinstance(next_item, BinaryContent):
        return False
    if not next_item.media_type.startswith("image/"):
        return False
    digest = _image_digest(next_item.data)
    for cap, doc, ref, sig in _PICTURE_TAG.findall(label_item):
        fields = [unquote(v) for v in (cap, doc, ref)]
        if signer.verifies(sig, "evidence-image", "v1", *fields, digest):
            return True
    return False


def redirect_tag(signer: TagSigner, conversation_id: str | None, question: int) -> str:
    """T3. Bound to this conversation and question, so a tag typed by a user or pasted from
    another conversation cannot pre-empt enforcement."""
    sig = signer.sign("cite-request", "v1", conversation_id or "", str(question))
    return f"[cite-request v1 q={question} sig={sig}]"


def is_our_redirect(signer: TagSigner, text: str, conversation_id: str | None, question: int) -> bool:
    """T3/T5. Only a verifying tag for exactly this question counts; anything else is not ours."""
    for q, sig in _REDIRECT_TAG.findall(text):
        if int(q) == question and signer.verifies(sig, "cite-request", "v1", conversation_id or "", q):
            return True
    return False


def has_machine_tag(text: str) -> bool:
    """Tag-shaped text, signed or not. Only the host writes tags, so a host can refuse any text a
    client sends with one (the trust boundary) instead of relying on verification alone."""
    return _ANY_TAG.search(text) is not None
