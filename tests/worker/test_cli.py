"""The `grounded` command: batch commands against the session worker, and the demo end to end.

What a user reads is checked through the real command: in-process (typer's runner) where the
output's destination does not matter, as a subprocess on a pipe or on a pseudo-terminal where it does.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import REPO, TEST_TAG_KEY, RedisServer
from tests.worker.conftest import Cluster
from worker.cli import cli
from worker.settings import get_settings
from worker.store.embedded import free_port

runner = CliRunner()
CONFIG = "agent:\n  model: extractive\n  capabilities:\n    - PassageSearchCapability: {corpus: handbook}\n"


@pytest.fixture
def cli_env(cluster: Cluster, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("GROUNDED_REDIS_URL", cluster.space.url)
    monkeypatch.setenv("GROUNDED_KEY_PREFIX", cluster.space.prefix)
    monkeypatch.setenv("GROUNDED_DATA_DIR", str(data_dir))
    monkeypatch.setenv("GROUNDED_TAG_KEYS", TEST_TAG_KEY)
    monkeypatch.setenv("COLUMNS", "200")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_submit_wait_status_and_results(cli_env: None, tmp_path: Path) -> None:
    line = {"custom_id": "hours", "question": "When does the observatory open?"}
    questions = write(tmp_path, "q.jsonl", json.dumps(line) + "\n")
    config = write(tmp_path, "job.yaml", CONFIG)
    submitted = runner.invoke(cli, ["submit", str(questions), "--config", str(config), "--wait", "--timeout", "30"])
    assert submitted.exit_code == 0, submitted.output
    batch_id = batch_of(submitted.output)
    assert "succeeded" in submitted.output
    status = runner.invoke(cli, ["status", batch_id])
    assert status.exit_code == 0 and "completed" in status.output
    out = tmp_path / "results.jsonl"
    assert runner.invoke(cli, ["results", batch_id, "-o", str(out)]).exit_code == 0
    [result] = [json.loads(line) for line in out.read_text().splitlines()]
    assert result["custom_id"] == "hours" and result["turns"][0]["citation_status"] == "grounded"


def test_a_bad_line_rejects_the_batch_with_its_line_number(cli_env: None, tmp_path: Path) -> None:
    questions = write(tmp_path, "q.jsonl", '{"custom_id": "a", "question": "fine"}\n{"question": "no id"}\n')
    config = write(tmp_path, "job.yaml", CONFIG)
    rejected = runner.invoke(cli, ["submit", str(questions), "--config", str(config)])
    assert rejected.exit_code == 1
    assert "nothing was enqueued" in rejected.output and "custom_id is required" in rejected.output


def test_ingest_refuses_a_corpus_path(cli_env: None, tmp_path: Path) -> None:
    refused = runner.invoke(cli, ["ingest", str(REPO / "tests" / "fixtures" / "corpus"), "--corpus", "../x"])
    assert refused.exit_code == 2 and "is not a corpus name" in refused.output


def test_demo_prints_results_and_writes_jsonl(redis_server: RedisServer, tmp_path: Path) -> None:
    """`grounded demo` as a user runs it, pointed at the test Redis through GROUNDED_REDIS_URL."""
    out = tmp_path / "demo.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GROUNDED_")}
    env.update(GROUNDED_REDIS_URL=redis_server.url, GROUNDED_TAG_KEYS=TEST_TAG_KEY, COLUMNS="200")
    demo = subprocess.run([sys.executable, "-m", "worker.cli", "demo", "-o", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "Results" in demo.stdout and str(out) in demo.stdout
    results = [json.loads(line) for line in out.read_text().splitlines()]
    questions = (REPO / "examples" / "questions.jsonl").read_text().splitlines()
    assert len(results) == len([q for q in questions if q.strip()])
    cited = [c for r in results for t in r["turns"] for c in t["cited"]]
    assert cited and all(f"[{c['chunk_id'][:8]}]" in demo.stdout for c in cited)   # not eaten as markup
    answers = sum(len(r["turns"]) for r in results)
    assert answers > len(results), "the sample batch holds a conversation"
    assert f"{len(results)} jobs: {len(results)} succeeded, 0 failed. {answers} answers" in demo.stdout
    assert "identity" not in demo.stdout   # the history position is no user's business
    assert all(r["status"] == "succeeded" and r["model"] == "extractive" for r in results)
    assert {r["turns"][0]["citation_status"] for r in results} <= {"grounded", "ungrounded"}
    assert not list(redis_server.client().scan_iter(match="grounded-demo:*"))


def batch_of(output: str) -> str:
    return output.split("batch ", 1)[1].split(":", 1)[0].strip()


def grounded(*args: str, tty: bool = False, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The real `grounded` command as a subprocess; on a pseudo-terminal when `tty` (stdout and
    stderr both, as a user's shell gives it)."""
    command = [sys.executable, "-m", "worker.cli", *args]
    environ = {**os.environ, **(env or {})}
    if not tty:
        done = subprocess.run(command, cwd=REPO, env=environ, capture_output=True, text=True, timeout=120)
        return done.returncode, done.stdout, done.stderr
    controller, terminal = pty.openpty()
    process = subprocess.Popen(command, cwd=REPO, env=environ, stdout=terminal, stderr=terminal)
    os.close(terminal)
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    code = process.wait(timeout=120)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    return code, text.replace("\r\n", "\n"), ""


BATCH = [{"custom_id": "hours", "question": "When does the observatory open?"},
         {"custom_id": "talk", "turns": ["When does the observatory open?", "How large is the reflector mirror?"]}]


@pytest.fixture
def answered(cli_env: None, cluster: Cluster, tmp_path: Path) -> tuple[str, str]:
    """A question and a conversation submitted with `submit --wait`; returns (batch id, its output)."""
    questions = write(tmp_path, "q.jsonl", "".join(json.dumps(line) + "\n" for line in BATCH))
    config = write(tmp_path, "job.yaml", CONFIG)
    submitted = runner.invoke(cli, ["submit", str(questions), "--config", str(config), "--wait", "--timeout", "60"])
    assert submitted.exit_code == 0, submitted.output
    return batch_of(submitted.output), submitted.output


def test_submit_wait_ends_with_the_answers_and_names_the_conversation(answered: tuple[str, str],
                                                                      cluster: Cluster) -> None:
    batch_id, output = answered
    results = {r.custom_id: r for r in cluster.store.iter_results(batch_id)}
    conversation_id = results["talk"].conversation_id
    assert conversation_id and f"conversation talk: {conversation_id}" in output
    assert output.index(f"conversation talk: {conversation_id}") < output.index("Results")
    for header in ("custom id", "status", "citation", "cited", "answer"):
        assert header in output
    assert "talk · turn 2" in output and "3 answers" in output and "2 jobs: 2 succeeded, 0 failed" in output
    cited = results["hours"].turns[0].cited[0]
    assert f"[{cited.chunk_id[:8]}] {cited.document_title}" in output   # the id in brackets, not eaten as markup


def test_results_is_a_table_on_a_terminal_and_jsonl_into_a_pipe(answered: tuple[str, str], cluster: Cluster) -> None:
    batch_id, _ = answered
    code, on_terminal, _ = grounded("results", batch_id, tty=True)
    assert code == 0, on_terminal
    assert "custom id" in on_terminal and "hours" in on_terminal and "grounded" in on_terminal
    assert '"job_id"' not in on_terminal and "--format jsonl" in on_terminal
    code, piped, err = grounded("results", batch_id)
    assert code == 0, err
    assert [json.loads(line)["custom_id"] for line in piped.splitlines()] == ["hours", "talk"]
    forced = runner.invoke(cli, ["results", batch_id, "--format", "table"])
    assert forced.exit_code == 0 and "talk · turn 1" in forced.output and '"job_id"' not in forced.output


def test_batch_ids_stay_whole_in_titles_on_a_narrow_terminal(answered: tuple[str, str]) -> None:
    batch_id, _ = answered
    code, status, _ = grounded("status", batch_id, env={"COLUMNS": "50"})
    assert code == 0 and f"Batch {batch_id}" in status.splitlines()
    assert "tenant" in status and "local" in status


def test_ask_prints_chunk_ids_and_no_internal_question_numbers(answered: tuple[str, str], cluster: Cluster) -> None:
    batch_id, _ = answered
    conversation_id = next(r.conversation_id for r in cluster.store.iter_results(batch_id) if r.custom_id == "talk")
    assert conversation_id is not None
    asked = runner.invoke(cli, ["ask", "--conversation", conversation_id, "When does the observatory open?"])
    assert asked.exit_code == 0, asked.output
    [job_id] = re.findall(r"job (job_\w+) queued", asked.output)
    result = cluster.store.load_result(job_id)
    assert result is not None and result.turns[0].cited
    for cited in result.turns[0].cited:
        assert f"[{cited.chunk_id[:8]}] {cited.document_title}" in asked.output
    assert "question " not in asked.output and "identity" not in asked.output


def row_cells(output: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is `first` (its first line, where a cell wraps)."""
    for text in output.splitlines():
        cells = [cell.strip() for cell in text.split("│")[1:-1]]
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{output}")


def pages(numbers: list[int]) -> str:
    """How a citation's pages read: the page to open, or the range a passage spans."""
    first, last = min(numbers), max(numbers)
    return f"p. {first}" if first == last else f"pp. {first}-{last}"


def test_the_installed_grounded_command_shows_what_a_user_needs(cli_env: None, cluster: Cluster,
                                                               tmp_path: Path) -> None:
    """The `grounded` console script itself, as a shell runs it (on a pipe): `submit --wait` ends
    with the conversation ids and one row per answer (custom id, status, citation status, the cited
    document and page); `ask` prints the answer, its citation status and what it cites."""
    script = Path(sys.executable).with_name("grounded")
    questions = write(tmp_path, "q.jsonl", "".join(json.dumps(line) + "\n" for line in BATCH))
    config = write(tmp_path, "job.yaml", CONFIG)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(script), *args], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "COLUMNS": "400"})

    submitted = run("submit", str(questions), "--config", str(config), "--wait", "--timeout", "60")
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    out = submitted.stdout
    results = {r.custom_id: r for r in cluster.store.iter_results(batch_of(out))}
    conversation_id = results["talk"].conversation_id
    assert conversation_id is not None and f"conversation talk: {conversation_id}" in out.splitlines()
    cited = results["hours"].turns[0].cited[0]
    assert row_cells(out, "hours")[:5] == ["hours", "When does the observatory open?", "succeeded", "grounded",
                                           f"[{cited.chunk_id[:8]}] Oakridge Observatory Handbook · p. 1"]
    assert "19:00" in row_cells(out, "hours")[5]
    assert row_cells(out, "talk · turn 2")[1:4] == ["How large is the reflector mirror?", "succeeded", "grounded"]
    assert "2 jobs: 2 succeeded, 0 failed. 3 answers" in out

    asked = run("ask", "--conversation", conversation_id, "How large is the reflector mirror?")
    assert asked.returncode == 0, asked.stdout + asked.stderr
    [job_id] = re.findall(rf"^job (job_\w+) queued on conversation {conversation_id}$", asked.stdout, re.M)
    result = cluster.store.load_result(job_id)
    assert result is not None and result.turns[0].cited
    lines = asked.stdout.splitlines()
    assert "400 mm" in lines[1]
    assert lines[2] == f"grounded: {len(result.turns[0].cited)} citation(s)"
    assert lines[3:] == [f"  [{c.chunk_id[:8]}] Oakridge Observatory Handbook · {pages(c.page_numbers)}"
                         for c in result.turns[0].cited]


def test_ask_acts_as_the_tenant_given(cli_env: None, cluster: Cluster) -> None:
    """`--tenant` names whose conversation a follow-up joins; another tenant's reads as not found."""
    batch_id = cluster.submit([{"custom_id": "acme-talk", "turns": ["When does the observatory open?"]}],
                              CONFIG, tenant="acme")
    [conversation_id] = cluster.store.job_ids(batch_id)
    question = ["ask", "--conversation", conversation_id, "How large is the reflector mirror?"]
    as_local = runner.invoke(cli, question)
    assert as_local.exit_code == 1 and f"conversation {conversation_id!r} not found" in as_local.stderr
    as_acme = runner.invoke(cli, [*question, "--tenant", "acme"])
    assert as_acme.exit_code == 0, as_acme.output
    assert "400 mm" in as_acme.stdout and "grounded" in as_acme.stdout
    turns = cluster.producer.conversations.turns(conversation_id)
    assert [t.result.question_text for t in turns] == ["When does the observatory open?",
                                                       "How large is the reflector mirror?"]


def test_error_text_from_a_user_is_printed_as_it_is(cli_env: None, tmp_path: Path) -> None:
    """A problem quoting the user's own `[...]` keeps it: messages are never read as markup."""
    questions = write(tmp_path, "q.jsonl", '{"custom_id": "a", "question": "fine", "[b]extra": 1}\n')
    rejected = runner.invoke(cli, ["submit", str(questions), "--config", str(write(tmp_path, "job.yaml", CONFIG))])
    assert rejected.exit_code == 1 and "unknown keys ['[b]extra']" in rejected.output
    refused = runner.invoke(cli, ["ingest", str(REPO / "tests" / "fixtures" / "corpus"), "--corpus", "[red]x"])
    assert refused.exit_code == 2 and "corpus '[red]x' is not a corpus name" in refused.output


@pytest.mark.parametrize("command", [
    ["submit", "Q", "--config", "C"], ["status", "batch_x"], ["results", "batch_x"], ["cancel", "batch_x"],
    ["ask", "--conversation", "job_x", "q"], ["compare", "batch_x"], ["experiment", "Q", "--arm", "on=C"],
    ["demo", "-o", "OUT"],
])
def test_a_command_that_cannot_reach_redis_says_so_in_one_line(command: list[str], tmp_path: Path) -> None:
    questions = write(tmp_path, "q.jsonl", '{"custom_id": "a", "question": "When does the observatory open?"}\n')
    config = write(tmp_path, "job.yaml", CONFIG)
    paths = {"Q": str(questions), "C": str(config), "on=C": f"on={config}", "OUT": str(tmp_path / "out.jsonl")}
    url = f"redis://127.0.0.1:{free_port()}/0"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GROUNDED_")}
    env.update(GROUNDED_REDIS_URL=url, GROUNDED_TAG_KEYS=TEST_TAG_KEY, GROUNDED_DATA_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "worker.cli", *[paths.get(a, a) for a in command]], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()] and "Traceback" not in done.stdout + done.stderr
    assert done.stderr.startswith(f"cannot reach Redis at {url} (GROUNDED_REDIS_URL): ")


def test_a_cited_chunk_is_labelled_with_its_page_or_else_its_section() -> None:
    from worker.cli.views import cited_label
    from worker.jobs.models import CitedChunk

    chunk = {"capability": "passages", "chunk_id": "bcf70dce0123", "document_title": "Fares [2026]"}
    assert cited_label(CitedChunk(**chunk, page_numbers=[4])) == "[bcf70dce] Fares [2026] · p. 4"
    assert cited_label(CitedChunk(**chunk, page_numbers=[5, 4, 6])) == "[bcf70dce] Fares [2026] · pp. 4-6"
    assert cited_label(CitedChunk(**chunk, headings=["Tickets", "Single"])) == "[bcf70dce] Fares [2026] · Single"


def test_the_results_table_shows_a_failed_job_with_its_error_type_and_message() -> None:
    from datetime import UTC, datetime

    from rich.console import Console

    from worker.cli.views import results_summary, results_table
    from worker.jobs.models import JobError, JobResult

    now = datetime.now(UTC)
    failed = JobResult(job_id="job_1", batch_id="batch_1", custom_id="[q1]", kind="question", status="failed",
                       error=JobError(type="ModelUnavailable", message="VLLM_API_KEY is not set"), model="m",
                       started_at=now, finished_at=now)
    console = Console(record=True, width=200)
    console.print(results_table([failed]))
    console.print(results_summary([failed]))
    text = console.export_text()
    assert "[q1]" in text and "failed" in text and "ModelUnavailable: VLLM_API_KEY is not set" in text
    assert "1 jobs: 0 succeeded, 1 failed. 0 answers" in text
