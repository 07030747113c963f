"""D5. A corpus on a read-only mount is served: the file ingest leaves (rollback-journal mode) is
read with `mode=ro`, and a file left in WAL mode is opened `immutable`, where plain `mode=ro`
cannot open it at all. Each reader is a subprocess on a real read-only bind mount
(tests/readonly.py)."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from capabilities.corpus import ingest
from tests.harness import FIXTURES
from tests.readonly import require_read_only_mounts, run_read_only

READER = """
import asyncio, json, os, sqlite3, sys
from capabilities.corpus import SQLiteCorpus

path = sys.argv[1]
folder = os.path.dirname(path)
try:
    open(os.path.join(folder, "probe"), "w")
    writable = True
except OSError as exc:
    writable = exc.strerror
try:
    plain = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    plain.execute("SELECT count(*) FROM documents").fetchone()
    plain_ro = "ok"
except sqlite3.Error as exc:
    plain_ro = str(exc)

async def main():
    store = SQLiteCorpus(path)
    hits = await store.search("observatory opens", limit=3, filter=None)
    await store.close()
    return [hit.document_title for hit in hits]

print(json.dumps({"writable": writable, "plain_ro": plain_ro, "titles": asyncio.run(main()),
                  "left": sorted(os.listdir(folder))}))
"""


def read_from_mount(db: Path) -> dict:
    done = run_read_only(db.parent, [sys.executable, "-c", READER, str(db)])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    require_read_only_mounts()
    folder = tmp_path / "corpora"
    folder.mkdir()
    return folder


def test_D5_a_corpus_as_ingest_leaves_it_is_searched_from_a_read_only_mount(corpus_dir):
    db = corpus_dir / "handbook.sqlite"
    ingest(db, [FIXTURES / "corpus"])
    seen = read_from_mount(db)
    assert seen["writable"] == "Read-only file system", "the mount really is read-only, root or not"
    assert seen["plain_ro"] == "ok"
    assert seen["titles"][0] == "Oakridge Observatory Handbook"
    assert seen["left"] == ["handbook.sqlite"]


def test_D5_a_corpus_left_in_wal_mode_is_opened_immutable_on_a_read_only_mount(corpus_dir):
    db = corpus_dir / "handbook.sqlite"
    ingest(db, [FIXTURES / "corpus"])
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode = WAL").fetchone() == ("wal",)
    conn.close()
    assert not Path(f"{db}-shm").exists()
    seen = read_from_mount(db)
    assert seen["plain_ro"] == "unable to open database file", "mode=ro alone cannot open it there"
    assert seen["titles"][0] == "Oakridge Observatory Handbook"
    assert seen["left"] == ["handbook.sqlite"]
