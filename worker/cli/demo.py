"""`grounded demo`: the whole path on one machine with nothing installed but this package.

Embedded Redis (or GROUNDED_REDIS_URL), the sample corpus ingested into a temporary data dir, a
real worker process, the sample batch with the offline extractive model (one conversation among
the questions), a progress bar, the results table, the conversation's turns and the JSONL file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis
from pydantic import SecretStr
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from capabilities import CAPSULE_HEADER, RECEIPT
from worker.jobs.models import JobResult, TurnResult
from worker.producer import Producer
from worker.settings import Settings
from worker.tasks.worker_process import REPO, start_worker_process

from .following import follow_batch
from .views import CITATION_STYLES, line, plain, results_summary, results_table

DEMO_CORPUS = "transit"
EXAMPLES = REPO / "examples"


@contextlib.contextmanager
def redis_url(console: Console, workdir: Path) -> Iterator[str]:
    """GROUNDED_REDIS_URL when set; otherwise an embedded redis-server for the demo's lifetime."""
    url = os.environ.get("GROUNDED_REDIS_URL")
    if url:
        redis.Redis.from_url(url).ping()  # unreachable: one line naming it (cli.main), not a worker timeout
        console.print(line("Redis: ", (url, "bold"), " (GROUNDED_REDIS_URL)"))
        yield url
        return
    from worker.store.embedded import EmbeddedRedis

    with EmbeddedRedis(workdir / "redis") as server:
        console.print(line("Redis: embedded redis-server on ", (server.url(), "bold")))
        yield server.url()


def earlier_evidence(turn: TurnResult) -> str:
    """What the turn's first request carried of earlier turns' search output: with the compactor,
    one capsule of what was cited and receipts for the rest; without it, every result in full."""
    returns = [part.get("content") for message in (turn.wire[0] if turn.wire else []) if message["kind"] == "request"
               for part in message["parts"]
               if part["part_kind"] == "tool-return" and not str(part.get("tool_name")).endswith("_cite")]
    capsules = sum(isinstance(r, str) and r.startswith(CAPSULE_HEADER) for r in returns)
    receipts = sum(r == RECEIPT for r in returns)
    counts = ((capsules, "capsule"), (receipts, "receipt(s)"), (len(returns) - capsules - receipts, "full result(s)"))
    return ", ".join(f"{n} {what}" for n, what in counts if n) or "—"


def conversation_table(result: JobResult) -> Table:
    """What each turn sent the model of earlier turns: the compactor's effect, turn by turn."""
    compactor = "compactor registered" if result.compactor_registered else "no compactor"
    table = Table(title=plain(f"Conversation {result.custom_id} ({compactor})"), show_lines=False, expand=True)
    table.add_column("turn", justify="right", no_wrap=True)
    table.add_column("question", ratio=3)
    table.add_column("citation", no_wrap=True)
    table.add_column("model requests", justify="right", no_wrap=True)
    table.add_column("earlier evidence sent to the model", ratio=2)
    for k, turn in enumerate(result.turns, start=1):
        table.add_row(str(k), plain(turn.question_text), plain(turn.citation_status, CITATION_STYLES[turn.citation_status]),
                      str(turn.n_requests), earlier_evidence(turn))
    return table


def run_demo(*, questions: Path, config: Path, corpus_dir: Path, output: Path, console: Console,
             timeout: float = 300.0) -> int:
    from capabilities.corpus import ingest

    with tempfile.TemporaryDirectory(prefix="grounded-demo-") as tmp, redis_url(console, Path(tmp)) as url:
        workdir = Path(tmp)
        data_dir = workdir / "data"
        (data_dir / "corpora").mkdir(parents=True)
        with console.status(plain(f"Ingesting {corpus_dir} as corpus '{DEMO_CORPUS}'")):
            report = ingest(data_dir / "corpora" / f"{DEMO_CORPUS}.sqlite", [corpus_dir])
        console.print(f"Corpus '{DEMO_CORPUS}': {escape(report.summary())}", highlight=False)
        if report.outcome == "nothing":
            return 2
        tag_keys = os.environ.get("GROUNDED_TAG_KEYS") or secrets.token_hex(16)
        prefix = f"grounded-demo:{secrets.token_hex(4)}:"  # never mixes with other users of a shared Redis
        env = {**os.environ, "GROUNDED_REDIS_URL": url, "GROUNDED_DATA_DIR": str(data_dir),
               "GROUNDED_KEY_PREFIX": prefix, "GROUNDED_TAG_KEYS": tag_keys, "PYTHONWARNINGS": "ignore"}
        settings = Settings(redis_url=url, data_dir=data_dir, key_prefix=prefix, tag_keys=[SecretStr(tag_keys)])
        producer = Producer(settings)
        with console.status("Starting a worker process"):
            worker = start_worker_process(env, workdir / "worker.log", loglevel="warning")
        try:
            console.print(line("Worker: ", (worker.name, "bold"), f" (threads pool, pid {worker.process.pid})"))
            batch_report = producer.validate(questions.read_text().splitlines(), config.read_text(),
                                             tenant=settings.cli_tenant)
            if not batch_report.ok:
                for error in batch_report.errors:
                    console.print(plain(error, "red"))
                return 1
            batch = producer.submit(batch_report, tenant=settings.cli_tenant)
            console.print(line("Batch ", (batch.id, "bold"), f": {batch.total} jobs, model ",
                               (batch.config.model, "bold")), soft_wrap=True)
            final = follow_batch(producer.store, batch.id, console, timeout=timeout)
            results = list(producer.store.iter_results(batch.id))
        finally:
            worker.stop()
            producer.store.delete_prefix()  # the demo's keys; its results are in the JSONL file
            producer.app.close()
    console.print(results_table(results))
    for result in results:
        if result.kind != "question" and result.turns:
            console.print(conversation_table(result))
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w") as handle:
        for result in results:
            handle.write(result.model_dump_json() + "\n")
    console.print(results_summary(results))
    console.print(line("Results (JSONL, one JobResult a line): ", (str(output), "bold")), soft_wrap=True)
    return 0 if final.failed == 0 else 1


def default_output() -> Path:
    return Path("reports") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
