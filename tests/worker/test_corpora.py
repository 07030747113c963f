"""The worker's corpus pool (worker/runtime/corpora.py): E3's store per run, reused across runs
only while it is still current."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from capabilities.corpus import ingest
from worker.runtime.corpora import CorpusPool

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"


@pytest.fixture
def corpus_file(tmp_path: Path) -> Path:
    path = tmp_path / "handbook.sqlite"
    ingest(path, [FIXTURES / "handbook.md"])
    return path


async def test_E3_a_run_gets_a_store_of_its_own_and_the_next_run_reuses_its_connection(corpus_file: Path) -> None:
    pool = CorpusPool()
    first, second = await pool.lease(corpus_file), await pool.lease(corpus_file)
    assert first.corpus is not second.corpus  # two runs at once never share a connection
    assert await first.search("observatory", limit=3, filter=None)
    opened = first.corpus
    await first.close()
    await first.close()  # idempotent, as CorpusStore.close is
    with pytest.raises(RuntimeError, match="closed"):
        await first.search("observatory", limit=3, filter=None)
    third = await pool.lease(corpus_file)
    assert third.corpus is opened
    await second.close()
    await third.close()


async def test_E3_a_corpus_written_since_is_opened_again_and_its_new_documents_found(corpus_file: Path,
                                                                                     tmp_path: Path) -> None:
    pool = CorpusPool()
    lease = await pool.lease(corpus_file)
    assert not await lease.search("zebra", limit=3, filter=None)
    opened = lease.corpus
    await lease.close()
    extra = tmp_path / "zoo.md"
    extra.write_text("# Zoo\n\nThe zebra enclosure opens at nine.\n")
    ingest(corpus_file, [extra])
    fresh = await pool.lease(corpus_file)
    assert fresh.corpus is not opened
    assert await fresh.search("zebra", limit=3, filter=None)
    await fresh.close()


async def test_E3_a_corpus_file_replaced_since_is_opened_again(corpus_file: Path, tmp_path: Path) -> None:
    pool = CorpusPool()
    lease = await pool.lease(corpus_file)
    opened = lease.corpus
    await lease.close()
    replacement = tmp_path / "other.sqlite"
    ingest(replacement, [FIXTURES / "notes.txt"])
    shutil.move(replacement, corpus_file)
    fresh = await pool.lease(corpus_file)
    assert fresh.corpus is not opened
    await fresh.close()
