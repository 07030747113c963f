"""What redis-py and kombu raise while Redis is down or restarting: one tuple for every caller that
turns an outage into something other than a crash (the task requeues its job, the API answers 503, the CLI prints one line)."""

import redis
from kombu.exceptions import OperationalError

REDIS_UNAVAILABLE: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError, OperationalError)


def unavailable(exc: Exception) -> str:
    """What every interface says during an outage: the caller may retry, and nothing was lost."""
    return f"the queue and results store (Redis) is unavailable: {type(exc).__name__}; retry later"
