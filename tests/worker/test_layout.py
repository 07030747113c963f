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


def test_worker_uses_only_the_public_surface_of_capabilities() -> None:
    """The capabilities package is usable by any host; what the worker needs from it is public (in
    `__all__`), so a refactor inside capabilities cannot break the worker unannounced."""
    import ast

    import capabilities
    import capabilities.corpus

    public = {"capabilities": set(capabilities.__all__), "capabilities.corpus": set(capabilities.corpus.__all__)}
    private: list[str] = []
    for path in sorted((REPO / "worker").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "capabilities":
                allowed = public.get(node.module, set())
                private += [f"{path.relative_to(REPO)}: {node.module}.{a.name}" for a in node.names
                            if a.name not in allowed]
    assert private == []
