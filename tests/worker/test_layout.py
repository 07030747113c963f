"""The house rules that a linter cannot see: importing the API, the CLI or the producer has no side
effects (no Celery app built, no settings read), and the worker's Celery app names its task."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

PROBE = """
import sys
import celery._state as celery_state
import worker.api, worker.cli, worker.client, worker.producer, worker.evaluation.experiment
from worker.settings import get_settings
print(get_settings.cache_info().currsize, len(list(celery_state._apps)), "worker.app" in sys.modules)
"""


def test_importing_api_cli_and_producer_builds_no_celery_app_and_reads_no_settings() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "0", "False"], out.stdout + out.stderr


def test_the_worker_app_registers_only_the_answer_task() -> None:
    probe = "from worker.app import app; app.loader.import_default_modules(); print(sorted(n for n in app.tasks if not n.startswith('celery.')))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['grounded.answer_job']", out.stdout + out.stderr
