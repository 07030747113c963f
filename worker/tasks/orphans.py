"""H18: a job whose message the broker lost is sent again (the finding is `worker.store.orphans`).

Every worker runs the sweep on a timer; a claim that expires with the interval lets one of them do
it per interval, so a fleet costs Redis what one worker does.
"""

from __future__ import annotations

import time
from typing import Any

import redis
import structlog
from celery import Celery

from worker.settings import Settings
from worker.store.keys import QUEUE, RETURNED_PRIORITY
from worker.store.orphans import OrphanStore, confirmed_orphans
from worker.store.results import ResultsStore

from .leases import PeriodicConsumerStep
from .names import ANSWER_JOB

log = structlog.get_logger()


def resend_lost_jobs(app: Celery, orphans: OrphanStore, *, grace_s: float, now: float) -> list[str]:
    """Re-sends the unfinished jobs found with no message twice, `grace_s` apart; returns their ids."""
    delivered = orphans.delivered_jobs()
    if delivered is None:  # a long queue is not read; the sweep waits for it to shorten
        return []
    unfinished = orphans.unfinished_jobs()
    missing = [job_id for job_id in unfinished if job_id not in delivered]
    resend, still_missing = confirmed_orphans(missing, orphans.first_missing(), now, grace_s)
    for job_id in resend:
        orphan = orphans.orphan(job_id, unfinished[job_id])
        kwargs = {"provider_waits": orphan.provider_waits} if orphan.provider_waits else {}
        app.send_task(ANSWER_JOB, args=[job_id], kwargs=kwargs, task_id=job_id, queue=QUEUE,
                      priority=RETURNED_PRIORITY, retries=orphan.retries, argsrepr=repr((job_id,)),
                      kwargsrepr=repr({"batch_id": orphan.batch_id, "resent": True}))
        log.warning("job_resent", job_id=job_id, batch_id=orphan.batch_id, reason="no message on the queue "
                    "or unacknowledged (lost by the broker)", starts=orphan.retries)
        del still_missing[job_id]
    orphans.remember_missing(still_missing)
    return resend


class LostJobSweep(PeriodicConsumerStep):
    thread_name = "grounded-lost-job-sweep"
    failure_event = "lost_job_sweep_failed"

    def interval_s(self, settings: Settings) -> float:
        return settings.orphan_sweep_s

    def tick(self, consumer: Any, client: redis.Redis, settings: Settings) -> None:
        orphans = OrphanStore(ResultsStore(client, prefix=settings.key_prefix))
        lapse_s = settings.orphan_sweep_s * 0.9  # the claim lapses before the next tick; a job missing then is resent
        if orphans.claim_sweep(lapse_s):
            resend_lost_jobs(consumer.app, orphans, grace_s=lapse_s, now=time.time())
