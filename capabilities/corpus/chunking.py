"""Blocks into chunks: one section at a time, long sections split at paragraph boundaries.

D1. A chunk never spans two sections or two pages, so its heading path and page are exact and
`read(page=N)` returns whole chunks only. Chunks aim at `TARGET_CHARS`: long enough to carry a
fact with its context, short enough that a search result set fits comfortably in a prompt.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .parsed import Block, PictureSource

TARGET_CHARS = 800
PARAGRAPH_SEPARATOR = "\n\n"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class ChunkDraft:
    """A chunk before it has an id: `blocks` are the indexes of the blocks it was cut from."""

    content: str
    headings: tuple[str, ...]
    page: int
    blocks: tuple[int, ...]
    pictures: tuple[PictureSource, ...]


def pack(pieces: Sequence[str], separator: str, limit: int) -> list[str]:
    """Greedy packing: consecutive pieces joined while the result stays within `limit`; a
    piece longer than `limit` stays whole (the caller cuts it finer first)."""
    packed: list[str] = []
    current = ""
    for piece in pieces:
        if current and len(current) + len(separator) + len(piece) > limit:
            packed.append(current)
            current = piece
        else:
            current = f"{current}{separator}{piece}" if current else piece
    if current:
        packed.append(current)
    return packed


def split_paragraph(text: str, limit: int = TARGET_CHARS) -> list[str]:
    """A paragraph longer than `limit` cut at sentence ends, then at spaces, then anywhere."""
    if len(text) <= limit:
        return [text]
    pieces: list[str] = []
    for sentence in _SENTENCE_END.split(text):
        if len(sentence) <= limit:
            pieces.append(sentence)
            continue
        for word_run in pack(sentence.split(), " ", limit):
            pieces.extend(word_run[i : i + limit] for i in range(0, len(word_run), limit))
    return pack(pieces, " ", limit)


def chunk_blocks(blocks: Sequence[Block], limit: int = TARGET_CHARS) -> list[ChunkDraft]:
    """Chunks in document order. A picture belongs to the chunk holding (the first piece of)
    the block it appeared in."""
    drafts: list[ChunkDraft] = []
    run: list[tuple[int, str, tuple[PictureSource, ...]]] = []

    def close_run() -> None:
        if not run:
            return
        first = blocks[run[0][0]]
        current: list[tuple[int, str, tuple[PictureSource, ...]]] = []
        size = 0
        for item in run:
            grown = size + (len(PARAGRAPH_SEPARATOR) if current else 0) + len(item[1])
            if current and grown > limit:
                drafts.append(_draft(current, first))
                current, size = [], 0
                grown = len(item[1])
            current.append(item)
            size = grown
        drafts.append(_draft(current, first))
        run.clear()

    for index, block in enumerate(blocks):
        if run and (block.headings, block.page) != (blocks[run[0][0]].headings, blocks[run[0][0]].page):
            close_run()
        for number, piece in enumerate(split_paragraph(block.text, limit) if block.text else [""]):
            run.append((index, piece, block.pictures if number == 0 else ()))
    close_run()
    return drafts


def _draft(items: list[tuple[int, str, tuple[PictureSource, ...]]], first: Block) -> ChunkDraft:
    return ChunkDraft(
        content=PARAGRAPH_SEPARATOR.join(text for _, text, _ in items if text),
        headings=first.headings,
        page=first.page,
        blocks=tuple(dict.fromkeys(index for index, _, _ in items)),
        pictures=tuple(picture for _, _, pictures in items for picture in pictures),
    )
