"""The worker's Celery app: what `celery -A worker.app worker` and `grounded worker` run.

The one module whose import builds an app and reads settings; nothing in the package imports it,
so importing the API, the CLI or the producer has no such side effect.
"""

from celery.signals import setup_logging, worker_shutting_down

from worker.settings import get_settings
from worker.tasks.celery_app import create_app
from worker.tasks.logs import configure_worker_logging
from worker.tasks.shutdown import on_worker_shutting_down

setup_logging.connect(configure_worker_logging)  # Celery's lines in our JSON format (tasks/logs.py)
worker_shutting_down.connect(on_worker_shutting_down)  # H15: the soft-shutdown window (tasks/shutdown.py)
app = create_app(get_settings())
app.set_current()
app.set_default()
