"""EvidenceCompactionCapability: earlier questions' evidence, replaced on the wire only (Part C).

Registering it is the switch (C1). What is sent to the model carries one capsule of everything
earlier answers cited plus short receipts; the stored history, where every identity and epoch is
a position, is never changed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, cast

from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability, WrapModelRequestHandler
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ToolReturnPart,
    UserContent,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestContext

from .capsule import (
    CAPSULE_HEADER,
    Capsule,
    RetainedPicture,
    build_capsule,
    group_label,
)
from .evidence import (
    DiscoveredEvidence,
    discover_evidence,
    evidence_owner,
    question_in_progress,
)
from .pictures import decode_picture
from .tags import TagSigner, is_our_picture

__all__ = [
    "CAPSULE_HEADER",
    "COMPACTOR_ID",
    "RECEIPT",
    "Capsule",
    "EvidenceCompactionCapability",
    "RetainedPicture",
    "build_capsule",
    "compact_history",
    "create_compactor",
    "group_label",
]

COMPACTOR_ID = "capabilities.evidence-compaction"

RECEIPT = (
    "[Earlier-question search output omitted here. "
    "Nothing in it counts as a citation for the question now being answered.]"
)

_log = logging.getLogger(__name__)


def _strip_our_pictures(items: Sequence[UserContent], signer: TagSigner) -> list[UserContent]:
    """C8. Only verified (label, image) pairs are ours; a user's picture, a lone label or text
    that merely reads like ours is kept, in order (R2)."""
    kept: list[UserContent] = []
    i = 0
    while i < len(items):
        if i + 1 < len(items) and is_our_picture(signer, items[i], items[i + 1]):
            i += 2
            continue
        kept.append(items[i])
        i += 1
    return kept


def _carrier(messages: Sequence[ModelMessage], boundary: int, owned: frozenset[str]) -> tuple[int, int] | None:
    """C7. The newest owned return below the boundary, by message index and part index, so two
    returns in one request cannot both carry the capsule (R33)."""
    for m in range(min(boundary, len(messages)) - 1, -1, -1):
        message = messages[m]
        if isinstance(message, ModelRequest):
            for p in range(len(message.parts) - 1, -1, -1):
                part = message.parts[p]
                if isinstance(part, ToolReturnPart) and part.tool_name in owned:
                    return (m, p)
    return None


def _compact_request(
    message: ModelRequest,
    index: int,
    *,
    owned: frozenset[str],
    carrier: tuple[int, int] | None,
    carrier_content: str,
    signer: TagSigner,
) -> list[ModelRequestPart]:
    parts: list[ModelRequestPart] = []
    for p, part in enumerate(message.parts):
        if isinstance(part, ToolReturnPart) and part.tool_name in owned:
            # our tools return plain ToolReturnParts (not the framework's tool-search or load subclasses)
            ours = cast(ToolReturnPart[Any], part)
            parts.append(replace(ours, content=carrier_content if (index, p) == carrier else RECEIPT))
        elif isinstance(part, UserPromptPart) and not isinstance(part.content, str):
            kept = _strip_our_pictures(part.content, signer)
            if len(kept) == len(part.content):
                parts.append(part)
            elif kept:
                parts.append(replace(part, content=kept))
        else:
            parts.append(part)
    return parts


def compact_history(
    messages: Sequence[ModelMessage],
    *,
    boundary: int,
    owned: Iterable[str],
    capsule_text: str,
    capsule_images: Sequence[UserContent],
    signer: TagSigner,
) -> list[ModelMessage]:
    """C7-C9, C11. Returns are rewritten, never removed, so each stays paired with its call as
    providers require. Only changed requests are replaced, by copies: the originals are shared
    with stored history. A request that stripping would leave partless is kept as it was (C9).
    Messages at or above the boundary are the live question and pass through untouched."""
    owned = frozenset(owned)
    carrier = _carrier(messages, boundary, owned)
    carrier_content = capsule_text or RECEIPT
    compacted: list[ModelMessage] = []
    for index, message in enumerate(messages):
        if index >= boundary or not isinstance(message, ModelRequest):
            compacted.append(message)
            continue
        parts = _compact_request(
            message, index, owned=owned, carrier=carrier, carrier_content=carrier_content, signer=signer
        )
        if carrier is not None and index == carrier[0] and capsule_images:
            parts.append(UserPromptPart(content=list(capsule_images)))
        changed = len(parts) != len(message.parts) or any(a is not b for a, b in zip(parts, message.parts))
        compacted.append(replace(message, parts=parts) if parts and changed else message)
    return compacted


def _earlier_returns_of(messages: Sequence[ModelMessage], boundary: int, tool_names: frozenset[str]) -> bool:
    return any(
        isinstance(part, ToolReturnPart) and part.tool_name in tool_names
        for message in messages[:boundary]
        if isinstance(message, ModelRequest)
        for part in message.parts
    )


def refuse_uncarried(found: Sequence[DiscoveredEvidence], messages: Sequence[ModelMessage], boundary: int) -> None:
    """C14. Compaction can only replace what it can rebuild from records: without one it would
    delete earlier evidence and leave the model no trace of it (R18). Each namespace is carried
    or lost on its own, and one whose earlier evidence is not on the wire is no reason to refuse
    (R19, R20)."""
    for view in found:
        if not view.state_carried and _earlier_returns_of(messages, boundary, view.tool_names):
            raise RuntimeError(
                f"evidence compaction: {view.capability!r} has evidence from earlier questions on the "
                f"wire but no record of it; the host must carry deps.state[{view.capability!r}] "
                "alongside the message history"
            )


async def fetch_pictures(
    ctx: RunContext[Any], pictures: Sequence[RetainedPicture], signer: TagSigner
) -> list[UserContent]:
    """C11. State never holds bytes, so each owner fetches its own. The cited text is already in
    the capsule, so a failed, missing or undecodable picture costs only that picture (R21)."""
    items: list[UserContent] = []
    for picture in pictures:
        owner = evidence_owner(ctx, picture.capability)
        try:
            data = await owner.get_picture_bytes(picture.document_id, picture.self_ref)
        except Exception:
            _log.warning(
                "capsule picture fetch failed",
                extra={"capability": picture.capability, "document_id": picture.document_id, "ref": picture.self_ref},
                exc_info=True,
            )
            continue
        image = decode_picture(data)
        if image is None:
            continue
        items += [picture.label(signer, image.data), image]
    return items


@dataclass(frozen=True)
class _Prepared:
    text: str
    images: tuple[UserContent, ...]


@dataclass
class EvidenceCompactionCapability(AbstractCapability[Any]):
    """Rewrites what is sent: earlier questions' evidence returns become one capsule of what was
    cited plus receipts. No tools, no state namespace, no configuration."""

    _: KW_ONLY
    signer: TagSigner = field(repr=False)
    prepared: dict[tuple[str | None, int], _Prepared] | None = field(default=None, repr=False, compare=False)
    """C12. Set on run copies only: a stored cache would freeze one question's capsule across the
    next, and concurrent runs must not share one."""

    async def for_run(self, ctx: RunContext[Any]) -> EvidenceCompactionCapability:
        return replace(self, prepared={})

    async def before_run(self, ctx: RunContext[Any]) -> None:
        """L2. The registry is complete by now (F13), so evidence capabilities that disagree on the
        question fail the run before any request is sent."""
        question_in_progress(discover_evidence(ctx))

    async def _prepare(self, ctx: RunContext[Any], found: Sequence[DiscoveredEvidence], boundary: int) -> _Prepared:
        """C12. Built at most once per request step, fetched images included."""
        assert self.prepared is not None, "wrap_model_request runs on the run copy that for_run returns"
        key = (ctx.run_id, ctx.run_step)
        if key not in self.prepared:
            capsule = build_capsule(found, boundary=boundary)
            images = await fetch_pictures(ctx, capsule.pictures, self.signer)
            self.prepared.clear()
            self.prepared[key] = _Prepared(capsule.text, tuple(images))
        return self.prepared[key]

    async def wrap_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> ModelResponse:
        """C2, C13. Only `request_context.messages` is reassigned: the host keeps the full
        transcript, and identities and epochs are positions in it."""
        found = discover_evidence(ctx)
        boundary = question_in_progress(found)
        if boundary == 0:
            return await handler(request_context)
        refuse_uncarried(found, request_context.messages, boundary)
        prepared = await self._prepare(ctx, found, boundary)
        request_context.messages = compact_history(
            request_context.messages,
            boundary=boundary,
            owned=frozenset().union(*(view.tool_names for view in found)),
            capsule_text=prepared.text,
            capsule_images=prepared.images,
            signer=self.signer,
        )
        return await handler(request_context)


def create_compactor(signer: TagSigner) -> EvidenceCompactionCapability:
    """C16. The explicit id makes a second compactor in one agent a `UserError` (F14, R37)."""
    return EvidenceCompactionCapability(
        id=COMPACTOR_ID,
        description="Replaces earlier questions' evidence on the wire with one capsule of what was cited.",
        signer=signer,
    )
