"""H19: jobs that come back are taken before new ones, in the order they came back; and H14: a
channel closed after its connection leaves its deliveries to their leases.

kombu itself, on a real Redis, through the transport the worker runs (worker.tasks.broker); the
deliveries are taken with basic_get, which reads the lanes in the order BRPOP does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from flower.utils.broker import Broker

from tests.conftest import RedisSpace
from worker.settings import Settings
from worker.store.keys import FRESH_PRIORITY, QUEUE, UNACKED_INDEX_KEY, UNACKED_KEY, queue_lanes
from worker.tasks.celery_app import create_app, create_flower_app
from worker.tasks.names import ANSWER_JOB


@pytest.fixture
def app(redis_space: RedisSpace) -> Iterator[Celery]:
    app = create_app(Settings(redis_url=redis_space.url, key_prefix=redis_space.prefix, lease_s=10))
    yield app
    app.close()


def submit(app: Celery, *job_ids: str) -> None:
    for job_id in job_ids:  # as the producer sends them
        app.send_task(ANSWER_JOB, args=[job_id], task_id=job_id, queue=QUEUE, priority=FRESH_PRIORITY)


def delivered_ago(client: redis.Redis, prefix: str, tag: str, seconds: float) -> None:
    """Backdates a delivery's lease, as if its worker had stopped renewing it `seconds` ago."""
    client.zadd(prefix + UNACKED_INDEX_KEY, {tag: time.time() - seconds}, xx=True)


def test_H19_returned_jobs_are_taken_before_new_ones_oldest_first_across_sweeps(
    app: Celery, redis_space: RedisSpace
) -> None:
    client = redis.Redis.from_url(redis_space.url)
    submit(app, "a", "b", "c", "d", "e")
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        taken = {m.headers["id"]: m for m in (channel.basic_get(QUEUE, no_ack=False) for _ in range(3))}
        assert list(taken) == ["a", "b", "c"], "new jobs in submission order"
        delivered_ago(client, redis_space.prefix, taken["a"].delivery_tag, 30)
        delivered_ago(client, redis_space.prefix, taken["b"].delivery_tag, 1)
        delivered_ago(client, redis_space.prefix, taken["c"].delivery_tag, 20)
        channel.qos.restore_visible(num=None, interval=1)  # a: the only expired lease
        delivered_ago(client, redis_space.prefix, taken["b"].delivery_tag, 12)
        channel.qos.restore_visible(num=None, interval=1)  # c (expired 10 s ago), then b (2 s ago)
        assert [client.llen(redis_space.prefix + lane) for lane in queue_lanes()] == [3, 2]
        order = [channel.basic_get(QUEUE, no_ack=True).headers["id"] for _ in range(5)]
    assert order == ["a", "c", "b", "d", "e"], "a came back first; a later sweep does not overtake it"


def test_H19_a_handed_back_job_waits_behind_jobs_returned_before_it_and_keeps_its_lane(
    app: Celery, redis_space: RedisSpace
) -> None:
    client = redis.Redis.from_url(redis_space.url)
    submit(app, "a", "b", "c")
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        a, b = channel.basic_get(QUEUE, no_ack=False), channel.basic_get(QUEUE, no_ack=False)
        delivered_ago(client, redis_space.prefix, a.delivery_tag, 30)
        channel.qos.restore_visible(num=None, interval=1)
        b.reject(requeue=True)  # what a hand-back and requeue.py do
        again = channel.basic_get(QUEUE, no_ack=True)
        assert (again.headers["id"], again.properties["priority"]) == ("a", 0)
        assert again.delivery_info["redelivered"]
        assert [channel.basic_get(QUEUE, no_ack=True).headers["id"] for _ in range(2)] == ["b", "c"]


def test_H14_a_channel_closed_after_its_connection_keeps_its_deliveries_for_the_lease_sweep(
    app: Celery, redis_space: RedisSpace
) -> None:
    """The order of a broker outage: the connection goes first, then the consumer closes its
    channel. kombu raised AttributeError there (fatal to a worker); the delivery stays unacknowledged."""
    client = redis.Redis.from_url(redis_space.url)
    submit(app, "a")
    connection = app.connection_for_read()
    channel = connection.default_channel
    taken = channel.basic_get(QUEUE, no_ack=False)
    channel.connection.client = None  # what kombu's Connection does to its transport when it closes
    channel.close()
    assert client.hexists(redis_space.prefix + UNACKED_KEY, taken.delivery_tag)
    assert [client.llen(redis_space.prefix + lane) for lane in queue_lanes()] == [0, 0]


@pytest.mark.parametrize("settle", ["reject", "ack"])
def test_H14_a_delivery_settled_after_its_connection_closed_is_left_to_the_lease_sweep(
    app: Celery, redis_space: RedisSpace, settle: str
) -> None:
    """A task that found Redis down rejects its job (requeue.py), or a finished one acknowledges
    it, after the outage closed the connection: kombu raised AttributeError there (fatal to a
    worker). The delivery stays recorded under its lease, and the sweep returns it."""
    client = redis.Redis.from_url(redis_space.url)
    submit(app, "a")
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        taken = channel.basic_get(QUEUE, no_ack=False)
        transport_client, channel.connection.client = channel.connection.client, None
        if settle == "reject":
            taken.reject(requeue=True)
        else:
            taken.ack()
        assert taken.delivery_tag not in channel.qos._delivered or taken.delivery_tag in channel.qos._dirty
        assert client.hexists(redis_space.prefix + UNACKED_KEY, taken.delivery_tag)
        channel.connection.client = transport_client
        delivered_ago(client, redis_space.prefix, taken.delivery_tag, 30)
        channel.qos.restore_visible(num=None, interval=1)
        again = channel.basic_get(QUEUE, no_ack=True)
    assert again.headers["id"] == "a" and again.delivery_info["redelivered"]


def test_H19_flower_reads_its_broker_as_redis_and_counts_both_lanes(app: Celery, redis_space: RedisSpace) -> None:
    flower = create_flower_app(Settings(redis_url=redis_space.url, key_prefix=redis_space.prefix))
    submit(app, "a", "b", "c")
    with app.connection_for_read() as connection:
        connection.default_channel.basic_get(QUEUE, no_ack=False).reject(requeue=True)  # "a" comes back
    uri = flower.connection_for_read().as_uri(include_password=True)
    assert uri.startswith("redis://")
    broker = Broker(uri, broker_options=flower.conf.broker_transport_options)
    assert asyncio.run(broker.queues([QUEUE])) == [{"name": QUEUE, "messages": 3}]
