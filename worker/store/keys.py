"""Every Redis key the stores write, in one place; each is relative to the deployment's key prefix
(GROUNDED_KEY_PREFIX), which Celery's transport writes under too.
"""

BATCH_KEY = "batch:{batch_id}"  # Batch JSON (config included)
BATCH_JOBS_KEY = "batch:{batch_id}:jobs"  # job ids in submission order (results stream in this order)
BATCH_DONE_KEY = "batch:{batch_id}:done"  # job ids with a result: the counter that must move once
BATCH_SUCCEEDED_KEY = "batch:{batch_id}:succeeded"
BATCH_FAILED_KEY = "batch:{batch_id}:failed"
BATCH_RUNNING_KEY = "batch:{batch_id}:running"
BATCH_CANCELLED_JOBS_KEY = "batch:{batch_id}:cancelled_jobs"  # skipped after a cancel; never run
BATCH_CANCEL_KEY = "batch:{batch_id}:cancel"  # set by cancel; tasks check it before running
BATCH_FINISHED_KEY = "batch:{batch_id}:finished"  # SETNX'd once, so batch_finished is emitted once
BATCH_EVENTS_KEY = "batch:{batch_id}:events"  # a stream: submitted, started, retrying, finished, ...
JOB_KEY = "job:{job_id}"
JOB_ATTEMPTS_KEY = "job:{job_id}:attempts"  # one INCR per start, redeliveries included
JOB_HANDBACKS_KEY = "job:{job_id}:handbacks"  # one INCR per run handed back at a worker's shutdown (H15)
RESULT_KEY = "result:{job_id}"
TENANT_BATCHES_KEY = "tenant:{tenant}:batches"  # sorted by submission time
CONVERSATION_KEY = "conversation:{conversation_id}"  # hash: meta, messages, state, version (conversations.py)
CONVERSATION_TURNS_KEY = "conversation:{conversation_id}:turns"  # committed turns, in order
CONVERSATION_JOBS_KEY = "conversation:{conversation_id}:jobs"  # its jobs in submission order (they run in it)
CONVERSATION_LOCK_KEY = "conversation:{conversation_id}:lock"  # one job at a time (H5)
FILE_KEY = "file:{file_id}"  # hash: meta (StoredFile JSON) and, for an upload, content (files.py)
OPENAI_BATCH_KEY = "openai:batch:{batch_id}"  # hash: record, and each moment it moved, set once (openai_batches.py)
TENANT_OPENAI_BATCHES_KEY = "tenant:{tenant}:openai_batches"  # sorted by creation time (cursor pages)
METRICS_KEY = "metrics"  # one hash: counters and histogram buckets (store/metrics.py)
UNACKED_KEY = "unacked"  # kombu's hash of delivered, unacknowledged messages (under global_keyprefix)
UNACKED_INDEX_KEY = "unacked_index"  # kombu's sorted set: delivery tag -> last renewal of its lease (H14)
UNACKED_MUTEX_KEY = "unacked_mutex"  # kombu's lock around one sweep for expired leases
ACTIVE_BATCHES_KEY = "active_batches"  # batches not yet finished: where a lost message is looked for (H18)
ORPHANS_KEY = "orphans"  # hash: job id -> when it was first seen with no message anywhere (store/orphans.py)
ORPHAN_SWEEP_CLAIM_KEY = "orphans:claim"  # one worker sweeps for lost messages per interval
QUEUE = "jobs"  # the Celery queue, two Redis lists (lanes) that workers BRPOP in order (H19):
RETURNED_PRIORITY = 0  # KEY_PREFIX + "jobs": jobs that came back (a dead worker's, handed back, requeued)
FRESH_PRIORITY = 9  # KEY_PREFIX + "jobs\x06\x169": jobs as submitted
PRIORITY_STEPS = (RETURNED_PRIORITY, FRESH_PRIORITY)
PRIORITY_SEPARATOR = "\x06\x16"  # kombu names lane p QUEUE + PRIORITY_SEPARATOR + p (lane 0: QUEUE alone)


def queue_lanes(queue: str = QUEUE) -> tuple[str, ...]:
    """The Redis lists of a queue (relative to the key prefix), in the order workers take from them;
    kombu names lane 0 by the queue alone."""
    return tuple(f"{queue}{PRIORITY_SEPARATOR}{p}" if p else queue for p in PRIORITY_STEPS)


# provider batch mode (H17, store/provider_batches.py)
JOB_PENDING_KEY = "job:{job_id}:pending"  # hash: a suspended question's round (data) and its version
JOB_CHAIN_KEY = "job:{job_id}:chain"  # the newest provider wait's number: older deliveries are stale copies
JOB_DETACHED_KEY = "job:{job_id}:detached"  # a lease: the job's run waits in a worker's loop for its submission
BATCH_WAITING_KEY = "batch:{batch_id}:waiting"  # job ids waiting on their provider (not holding a slot)
BATCH_PROVIDER_BATCHES_KEY = "batch:{batch_id}:provider_batches"  # provider batch ids its jobs waited on
PROVIDER_BATCH_KEY = "provider_batch:{provider_batch_id}"  # hash: the handle (to cancel it), cancelled flag
PROVIDER_BATCH_JOBS_KEY = "provider_batch:{provider_batch_id}:jobs"  # jobs that waited on it
PROVIDER_BATCH_ABANDONED_KEY = "provider_batch:{provider_batch_id}:abandoned"  # its requests nobody will collect
PROVIDER_WAITING_KEY = "provider_waiting"  # every job waiting on a provider: the /metrics gauge
