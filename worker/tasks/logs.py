"""structlog, configured once per process: JSON lines with the job's ids bound at the task edge.

The ids are context variables, so they reach the agent run the task submits to the process's event
loop (the coroutine is scheduled from the task's thread and inherits a copy of its context). In a
worker, Celery's own lines and the standard-library loggers go through the same processors, so a
log pipeline reads one format with the job's ids on every line logged while a job runs. JSON unless
stderr is a terminal, where people read the console renderer instead.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

import structlog
from structlog.contextvars import bound_contextvars
from structlog.typing import EventDict, Processor, WrappedLogger

from worker.redaction import REDACTED, is_secret_name

if TYPE_CHECKING:
    from worker.jobs.models import Batch, Job

MAX_VALUE_CHARS = 500
JOB_FIELDS = ("job_id", "batch_id", "tenant", "custom_id", "attempt")

_lock = threading.Lock()
_configured = False


def redact(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """No secrets or document text in logs: values under secret-looking names are replaced, and long
    strings (a question, a passage, a provider's error body) are cut, so a careless call cannot leak
    them whole. Tracebacks are formatted after this and kept."""
    for name, value in list(event_dict.items()):
        if is_secret_name(name):
            event_dict[name] = REDACTED
        elif isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
            event_dict[name] = f"{value[:MAX_VALUE_CHARS]}...[{len(value) - MAX_VALUE_CHARS} more chars]"
    return event_dict


def renderer_for(stream: IO[str] | None) -> Processor:
    """Machines get JSON; a person at a terminal gets the console renderer."""
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        return structlog.dev.ConsoleRenderer()
    return structlog.processors.JSONRenderer()


def shared_processors() -> list[Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact,
    ]


def configure_logging(level: str = "INFO") -> None:
    global _configured
    with _lock:
        if _configured:
            return
        structlog.configure(
            processors=[*shared_processors(), structlog.processors.format_exc_info, renderer_for(sys.__stderr__)],
            wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
            logger_factory=structlog.WriteLoggerFactory(file=sys.__stderr__),
            cache_logger_on_first_use=True,
        )
        _configured = True


def configure_worker_logging(loglevel: int | str | None = None, **_: Any) -> None:
    """Receiver for Celery's `setup_logging` signal: with a receiver connected Celery leaves logging
    to us, and its lines (task received, succeeded, ...) and the stdlib loggers' get our format."""
    configure_logging()
    handler = logging.StreamHandler(sys.__stderr__)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared_processors(), structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer_for(sys.__stderr__)],
    ))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(loglevel or logging.INFO)


@contextmanager
def job_context(job: Job, batch: Batch) -> Iterator[None]:
    """Binds the job's ids for every line logged while it runs. `attempt` is bound here too (as None
    until the task counts the start) so that leaving unbinds it: a pool thread runs many jobs, and
    a later job must not inherit this one's attempt."""
    with bound_contextvars(job_id=job.id, batch_id=batch.id, tenant=batch.tenant, custom_id=job.custom_id,
                           attempt=None):
        yield


def bind_attempt(attempt: int) -> None:
    structlog.contextvars.bind_contextvars(attempt=attempt)
