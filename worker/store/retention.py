"""Retention: every key a batch owns expires with the batch's own key (H16).

Redis expires keys itself, so no sweeper process has to be alive for data to go. The batch's key
gets an absolute expiry when it is stored (the deployment's retention, or a shorter one its config
asks for); every later write for that batch (results, events, attempts, running sets, its
conversations, its OpenAI Batch record and files) passes the keys it wrote to `retain`, which copies
the batch key's remaining lifetime onto them in the same transaction. The batch key is the one
source of truth, so a key written a month after submission expires at the same moment as the rest.

When the batch key is gone (deleted, or expired) `retain` deletes what was just written instead,
so a job still running when its batch is deleted cannot bring any of it back. Keys that a newer
batch may keep alive (a conversation continued by follow-ups, a tenant's index) are only ever
pushed later (`extend`), never cut short, and outlive a deleted batch that is not theirs (`drop`
off).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import redis

from worker.settings import DAY_S

from .scripts import eval_script

# KEYS[1]: the anchor whose lifetime the others take; KEYS[2..]: the keys just written.
# ARGV[1]: '1' to only push an expiry later; ARGV[2]: '1' to delete the keys when the anchor is gone.
_RETAIN = """
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then
  if ARGV[2] == '1' then for i = 2, #KEYS do redis.call('DEL', KEYS[i]) end end
  return 0
end
if ttl == -1 then return 0 end
for i = 2, #KEYS do
  local has = ARGV[1] == '1' and redis.call('PTTL', KEYS[i]) or -1
  if has == -1 or has < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
end
return 1
"""


def retain(client: Any, anchor: str, keys: Sequence[str], *, extend: bool = False, drop: bool = True) -> None:
    """Queues (on a pipeline) or runs the one script that gives `keys` the anchor's
    expiry. A key of an anchor kept without expiry (stored before retention existed) is left as it is."""
    if keys:
        eval_script(client, _RETAIN, [anchor, *keys], ["1" if extend else "0", "1" if drop else "0"])


def batch_expiry(created_at: datetime, retention_s: float, requested_days: float | None) -> datetime:
    """The deployment's retention, or the batch's own when it asks for less (never more)."""
    seconds = retention_s if requested_days is None else min(retention_s, requested_days * DAY_S)
    return created_at + timedelta(seconds=seconds)


def longer_than_allowed(requested_days: float | None, retention_days: float) -> str | None:
    """The refusal of a config asking to keep its batch longer than the deployment does; None if fine."""
    if requested_days is None or requested_days <= retention_days:
        return None
    return (f"retention_days {requested_days:g} is longer than this deployment keeps batches "
            f"(GROUNDED_RETENTION_DAYS={retention_days:g}); a batch may only shorten it")


def live_members(client: redis.Redis, index: str, start: int, stop: int, key_of: Callable[[str], str]) -> list[str]:
    """Members of a newest-first sorted-set index whose record still exists: a member cannot expire
    by itself, so those whose record expired or was deleted are removed as they are read."""
    while True:
        ids = [i.decode() for i in client.zrevrange(index, start, stop)]
        with client.pipeline(transaction=False) as pipe:
            for member in ids:
                pipe.exists(key_of(member))
            found = pipe.execute()
        gone = [member for member, exists in zip(ids, found, strict=True) if not exists]
        if not gone:
            return ids
        client.zrem(index, *gone)
