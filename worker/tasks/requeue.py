"""A job whose task could not reach Redis is put back, never acknowledged as done.

With acks_late, Celery acknowledges a task that raised, so a job whose result could not be written
because Redis was restarting would be acknowledged once Redis returned, and lost: no result, and
its batch would never finish. Rejecting with requeue puts it back on the queue instead (or, while
Redis is still down, leaves it unacknowledged for the visibility sweep), and the re-run overwrites
its own result idempotently.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

import structlog
from celery.exceptions import Reject

from worker.store.outages import REDIS_UNAVAILABLE

F = TypeVar("F", bound=Callable[..., Any])

log = structlog.get_logger()


def requeue_when_redis_is_down(task: F) -> F:
    @functools.wraps(task)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return task(*args, **kwargs)
        except REDIS_UNAVAILABLE as exc:
            log.warning("job_requeued", reason="redis_unavailable", error=f"{type(exc).__name__}: {exc}")
            raise Reject(f"Redis unavailable: {exc}", requeue=True) from exc

    return cast(F, run)  # functools.wraps keeps the signature; mypy cannot see that
