"""The Celery app's settings, each with its reason (docs/design/architecture.md, "Queue").

`create_app` builds an app and nothing else: the worker's instance is `worker.app` (what
`celery -A worker.app` and `grounded worker` run), and producers build their own to send tasks by
name, so they never import the task code.
"""

from __future__ import annotations

from typing import Any

from celery import Celery, bootsteps

from worker.settings import Settings, get_settings
from worker.store.keys import PRIORITY_STEPS, QUEUE

from .leases import LeaseRenewal
from .names import ANSWER_JOB
from .orphans import LostJobSweep

__all__ = ["ANSWER_JOB", "create_app", "create_flower_app"]
UNACKED_MUTEX_EXPIRE_S = 5
TASK_MODULES = ["worker.tasks.answer"]


class RequireTagKeys(bootsteps.StartStopStep):
    """H8. Refuses to start a worker without tag keys: a bootstep that raises stops the worker
    before it consumes anything, whereas a signal handler's exception is only logged."""

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        get_settings().signer()


def create_app(settings: Settings, *, transport: str = "worker.tasks.broker:Transport") -> Celery:
    app = Celery("grounded", broker=settings.redis_url, include=TASK_MODULES, set_as_current=False)
    app.conf.update(
        # a job is acknowledged only after it finished, so a killed worker's job is redelivered,
        # not lost; results are idempotent per job (results.py), so a second run is harmless
        task_acks_late=True,
        # a prefork child that dies mid-job has its job requeued at once instead of acknowledged
        task_reject_on_worker_lost=True,
        # a failed job's task raises JobFailed after its result is stored (H12): that is an outcome,
        # acknowledged like a success, never redelivered (Celery's default, stated because acks_late
        # readers ask)
        task_acks_on_failure_or_timeout=True,
        # an idle worker can take what a busy one would otherwise hoard
        worker_prefetch_multiplier=1,
        # no task has a rate limit, so the consumer need not check one for every message it takes
        worker_disable_rate_limits=True,
        # only job ids travel (jobs are re-read from the store), as JSON
        task_serializer="json",
        accept_content=["json"],
        # results live in our store; Celery's result backend would hold a second, partial copy
        task_ignore_result=True,
        task_default_queue=QUEUE,
        # enforced by the prefork pool only; threads cannot be killed, so run.timeout_s (capped by
        # the soft limit) cancels the agent run on the event loop instead
        task_soft_time_limit=settings.task_soft_limit_s,
        task_time_limit=settings.task_hard_limit_s,
        # H19: kombu's Redis transport with a lane for jobs that come back, taken before new ones
        broker_transport=transport,
        broker_transport_options={
            "priority_steps": list(PRIORITY_STEPS),
            # H14: a delivery not renewed for this long belongs to a dead worker and is swept back
            # to the queue; live workers renew theirs (leases.py), so it need not outlast a job
            "visibility_timeout": settings.lease_s,
            # kombu 5.7 sweeps for expired leases every interval * throttle seconds (~100 s by
            # default); every 2 s here
            "unacked_restore_interval": settings.unacked_restore_interval_s,
            "unacked_restore_throttle": settings.unacked_restore_throttle,
            # kombu's lock around one sweep expires after 300 s by default, and a worker killed
            # while holding it stalls every sweep until then; a sweep takes milliseconds, and two
            # at once are safe (each restore is a WATCHed transaction)
            "unacked_mutex_expire": UNACKED_MUTEX_EXPIRE_S,
            # every broker key under our prefix, beside the results store's keys
            "global_keyprefix": settings.key_prefix,
        },
        # task events for Flower; task-sent events show queued jobs too
        worker_send_task_events=True,
        task_send_sent_event=True,
        broker_connection_retry_on_startup=True,
        # a Redis that restarts can answer with channel errors (a reply cut off mid-restart) before
        # the connection itself fails; those are recoverable too, or the worker exits instead of
        # reconnecting (tests/reliability/test_redis_restart.py)
        broker_channel_error_retry=True,
        worker_pool=settings.pool,
        worker_concurrency=settings.concurrency,
    )
    app.steps["worker"].add(RequireTagKeys)
    app.steps["consumer"].add(LeaseRenewal)
    app.steps["consumer"].add(LostJobSweep)
    return app


def create_flower_app(settings: Settings) -> Celery:
    """Flower's app runs on kombu's own Redis transport: Flower picks the reader of its queue
    lengths by the broker URL's scheme, which must read `redis`, and it never takes a job, so the
    returned lane's restores (H19) are not its business. It still counts both lanes, through the
    priority steps in the transport options."""
    return create_app(settings, transport="redis")
