"""Streamed bodies (worker/api/streaming.py): the same bytes, in chunks instead of a line at a time."""

from __future__ import annotations

from worker.api.streaming import in_chunks


def test_lines_are_joined_into_chunks_of_about_the_size_asked_and_nothing_is_lost() -> None:
    lines = [f'{{"n": {i}}}\n'.encode() for i in range(1000)]
    chunks = list(in_chunks(lines, size=1024))
    assert b"".join(chunks) == b"".join(lines)
    assert len(chunks) <= sum(map(len, lines)) // 1024 + 1
    assert all(len(chunk) >= 1024 for chunk in chunks[:-1]) and all(len(chunk) < 1024 + 16 for chunk in chunks)


def test_a_line_longer_than_a_chunk_is_sent_whole_and_an_empty_body_sends_nothing() -> None:
    assert list(in_chunks([b"x" * 5000, b"y\n"], size=1024)) == [b"x" * 5000, b"y\n"]
    assert list(in_chunks([], size=1024)) == []
