"""H19: a job that goes back to the queue is taken again before new ones, oldest first.

Jobs come back when a worker dies (their leases expire, H14), when a stopping worker hands them
back (H15) and when a result could not be stored (requeue.py). kombu puts each at the front of the
one queue list, so under a run of worker deaths the newest job swept back overtakes every older
one still waiting there: in a 20-kill run a job waited three lease periods for a slot while jobs
lost after it went first. Here the queue has two lanes, kombu's priority lists, which workers BRPOP
in order: new jobs wait in the fresh lane; a job that comes back joins the back of the returned
lane, and the sweep returns expired leases oldest first. A returned job waits only for the jobs
returned before it, never for new ones.
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual as kombu_virtual
from kombu.utils.json import dumps

from worker.store.keys import RETURNED_PRIORITY

__all__ = ["Transport"]

log = structlog.get_logger()


class ReturningQoS(kombu_redis.QoS):
    """A broker outage closes a channel's connection, and kombu then reaches Redis through that
    connection to restore, acknowledge or reject the channel's deliveries: it raised AttributeError,
    which Celery takes for a fatal error and exits (in about 1 of 25 Redis-restart runs, first when
    the closing channel restored its deliveries, then when a task that had found Redis down rejected
    its job, requeue.py). Such deliveries are still recorded in Redis under their leases, which bring
    them back (H14); the re-run writes its result once (H10). So on a closed channel the three
    only let go of the deliveries in memory, and the leases do the rest."""

    def _connection_closed(self) -> bool:
        transport = self.channel.connection
        return transport is None or transport.client is None

    def restore_unacked(self, client: Any = None) -> None:
        if client is None and self._connection_closed():
            log.warning("unacked_restore_skipped", deliveries=len(self._delivered),
                        reason="the broker connection closed first; their leases return them")
            return
        super().restore_unacked(client)

    def _let_go(self, delivery_tag: str, event: str, **fields: Any) -> None:
        """Forgets the delivery in memory only (kombu's in-memory ack), leaving Redis's record of it."""
        log.warning(event, reason="the broker connection closed first; the lease returns the job", **fields)
        kombu_virtual.QoS.ack(self, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        if self._connection_closed():
            self._let_go(delivery_tag, "ack_skipped")
        else:
            super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if self._connection_closed():
            self._let_go(delivery_tag, "reject_skipped", requeue=requeue)
        else:
            super().reject(delivery_tag, requeue=requeue)

    def restore_visible(self, start: int = 0, num: int | None = 10, interval: int = 10) -> None:
        """kombu's sweep for expired leases, in the order they expired (kombu walks them newest
        first); every live worker sweeps, and the mutex only keeps two from doing it at once."""
        self._vrestore_count += 1
        if (self._vrestore_count - 1) % (interval or 1):
            return
        with self.channel.conn_or_acquire() as client:
            ceiling = time.time() - self.visibility_timeout
            try:
                with kombu_redis.Mutex(client, self.unacked_mutex_key, self.unacked_mutex_expire):
                    expired = client.zrange(self.unacked_index_key, 0, ceiling, byscore=True,
                                            offset=start if num else None, num=num)
                    for tag in expired or []:
                        self.restore_by_tag(tag, client)
            except kombu_redis.MutexHeld:
                pass


class ReturningChannel(kombu_redis.Channel):
    QoS = ReturningQoS

    def _do_restore_message(self, payload: dict[str, Any], exchange: str, routing_key: str, pipe: Any,
                            leftmost: bool = False) -> None:
        """Every way back (a swept lease, a hand-back, a requeue) leads to the back of the returned
        lane; the message keeps that lane if it is retried later. Runs inside kombu's restore
        transaction, so a connection error must abort it (or the message would leave `unacked`
        without reaching a list)."""
        try:
            payload["headers"]["redelivered"] = True
            payload["properties"]["delivery_info"]["redelivered"] = True
            payload["properties"]["priority"] = RETURNED_PRIORITY
        except (KeyError, TypeError):
            pass
        for queue in self._lookup(exchange, routing_key):
            pipe.lpush(self._q_for_pri(queue, RETURNED_PRIORITY), dumps(payload))


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with the returned lane; Celery loads it by path (broker_transport)."""

    Channel = ReturningChannel
