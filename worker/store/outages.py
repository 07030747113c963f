"""What redis-py and kombu raise while Redis is down or restarting: one tuple for every caller that
turns an outage into something other than a crash (the task requeues its job, the API answers 503)."""

import redis
from kombu.exceptions import OperationalError

REDIS_UNAVAILABLE: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError, OperationalError)
