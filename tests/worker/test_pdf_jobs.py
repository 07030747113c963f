"""A question job over a PDF, through a real worker whose corpora are on a read-only mount:
the extractive model cites the passage from the PDF page that says it (D1, D5)."""

from __future__ import annotations

from pathlib import Path

from capabilities.corpus import ingest
from tests.conftest import RedisServer, new_space, worker_env
from tests.documents import text_pdf
from tests.readonly import read_only_prefix, require_read_only_mounts
from tests.worker.conftest import Cluster, question_config, settings_for
from worker.producer import Producer
from worker.tasks.worker_process import start_worker_process


def test_D1_D5_a_question_cites_the_right_pdf_page_from_a_read_only_corpus_mount(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    require_read_only_mounts()
    data_dir = tmp_path / "data"
    (data_dir / "corpora").mkdir(parents=True)
    report = ingest(data_dir / "corpora" / "harbour.sqlite", [text_pdf(tmp_path / "manual.pdf")])
    assert report.outcome == "complete" and report.journal_mode == "delete"
    space = new_space(redis_server)
    worker = start_worker_process(worker_env(space, data_dir), tmp_path / "worker.log", concurrency=2,
                                  command_prefix=read_only_prefix(data_dir))
    producer = Producer(settings_for(space, data_dir))
    cluster = Cluster(space, worker, producer)
    try:
        line = {"custom_id": "cones", "question": "What does the keeper hoist on the signal mast during a gale?"}
        config = question_config({"PassageSearchCapability": {"corpus": "harbour"}})
        batch_id = cluster.submit([line], config)
        progress = cluster.wait(batch_id, timeout=90)
        assert progress.succeeded == 1, worker.output()[-3000:]
        [result] = list(cluster.store.iter_results(batch_id))
        turn = result.turns[0]
        assert turn.citation_status == "grounded"
        [cited] = turn.cited
        assert cited.document_title == "Harbour Lamp Manual"
        assert cited.page_numbers == [4], "the storm signals are on the PDF's fourth physical page"
        assert "two black cones" in str(turn.answer)
        assert "readonly" not in worker.output().lower()
    finally:
        worker.stop()
        producer.app.close()
        space.clean()
