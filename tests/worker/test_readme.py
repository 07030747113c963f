"""The README says what a user meets: its Python snippet runs as written against a real API and
worker (failed jobs included), its settings table lists every setting, and its limits are the code's."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.worker.conftest import FAKE_KEY_ENV, PASSAGES, Cluster, question_config, serve, settings_for
from tests.worker.fake_openai import FakeOpenAI
from worker.api.app import create_api
from worker.jobs.lines import MAX_TEXT
from worker.producer import Producer
from worker.settings import Settings

README = (REPO / "README.md").read_text()
SNIPPET_URL, SNIPPET_TOKEN = "http://localhost:8000", "tok-abc"


def python_snippet() -> str:
    """The README's client example: the first Python block after "From Python"."""
    after = README.split("From Python", 1)[1]
    match = re.search(r"```python\n(.*?)```", after, re.S)
    assert match, "the README has no Python example"
    return match.group(1)


@pytest.fixture
def readme_api(cluster: Cluster, data_dir: Path) -> Iterator[str]:
    """The API with the README's own token for tenant acme (GROUNDED_API_TOKENS=tok-abc=acme,...)."""
    assert f"GROUNDED_API_TOKENS={SNIPPET_TOKEN}=acme" in README
    settings = settings_for(cluster.space, data_dir, api_tokens={SNIPPET_TOKEN: "acme"})
    with serve(create_api(settings, producer=Producer(settings, store=cluster.store, app=cluster.producer.app))) as url:
        yield url


def test_the_python_snippet_runs_as_written_when_a_job_fails(readme_api: str, fake_openai: FakeOpenAI) -> None:
    """One job answers, one fails (a 503 with no retries left): the snippet prints both, crashing on neither."""
    snippet = python_snippet()
    assert snippet.count(SNIPPET_URL) == 1
    lines = [{"custom_id": "fine", "question": "When does the observatory open?"},
             {"custom_id": "broken", "question": "[down:readme1] When does the observatory open?"}]
    config = question_config(PASSAGES, model="fake-model", run={"retries": 0},
                             endpoint={"base_url": fake_openai.base_url, "api_key_env": FAKE_KEY_ENV})
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(snippet.replace(SNIPPET_URL, readme_api), {"lines": lines, "config": config})
    out = printed.getvalue().splitlines()
    assert "fine grounded Fake answer from the knowledge base." in out
    [failed] = [line for line in out if line.startswith("broken ")]
    assert failed.startswith("broken failed: ModelUnavailableError status_code: 503")


def test_the_settings_table_lists_every_setting() -> None:
    rows = [line for line in README.splitlines() if line.startswith("| `")]
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", "\n".join(rows)))
    names = {(field.validation_alias.choices[0] if field.validation_alias else f"GROUNDED_{name.upper()}")  # type: ignore[union-attr]
             for name, field in Settings.model_fields.items()}
    assert names - documented == set()


def test_the_question_length_limit_is_the_codes() -> None:
    assert f"at most {MAX_TEXT:,} characters" in README
