"""The `grounded` command: batch commands against the session worker, and the demo end to end."""

from __future__ import annotations

import json
import os
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

runner = CliRunner()
CONFIG = "agent:\n  model: extractive\n  capabilities:\n    - PassageSearchCapability: {corpus: handbook}\n"


@pytest.fixture
def cli_env(cluster: Cluster, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("GROUNDED_REDIS_URL", cluster.space.url)
    monkeypatch.setenv("GROUNDED_KEY_PREFIX", cluster.space.prefix)
    monkeypatch.setenv("GROUNDED_DATA_DIR", str(data_dir))
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
    batch_id = submitted.output.split("batch ", 1)[1].split(":", 1)[0].strip()
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
    assert all(r["status"] == "succeeded" and r["model"] == "extractive" for r in results)
    assert {r["turns"][0]["citation_status"] for r in results} <= {"grounded", "ungrounded"}
    assert not list(redis_server.client().scan_iter(match="grounded-demo:*"))
