"""Bodies streamed in chunks of lines, not a line at a time."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

CHUNK_BYTES = 256 * 1024


def in_chunks(lines: Iterable[bytes], size: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Lines joined into chunks of about `size` bytes. StreamingResponse takes each item of a plain
    iterator on a worker thread and sends it as a message of its own, so a body yielded a line at a
    time cost a thread hop and a send for every result of a batch."""
    chunk: list[bytes] = []
    held = 0
    for line in lines:
        chunk.append(line)
        held += len(line)
        if held >= size:
            yield b"".join(chunk)
            chunk, held = [], 0
    if chunk:
        yield b"".join(chunk)
