"""Reading kombu's messages where its Redis transport keeps them, under our key prefix: the queue's
list holds each message as JSON, the unacknowledged hash `[message, exchange, routing_key]`."""

from __future__ import annotations

import json


def message_job_id(raw: bytes | str) -> str | None:
    """The job id of a message in either form: Celery's task id, which the producer sets to it."""
    try:
        payload = json.loads(raw)
    except ValueError:
        return None
    message = payload[0] if isinstance(payload, list) and payload else payload
    headers = message.get("headers") if isinstance(message, dict) else None
    task_id = headers.get("id") if isinstance(headers, dict) else None
    return task_id if isinstance(task_id, str) else None
