"""Redis restart mid-batch: a test-owned redis-server with its append-only file on fsync-always is
killed (-9) while workers run a batch, and started again on the same port and directory.

Nothing accepted is lost (every job of the batch ends with one result), no result written before
the restart is lost, and the workers and the API reconnect by themselves: the batch finishes and
the API accepts and serves a new batch, with no process restarted by the test.
"""

from __future__ import annotations

import time
from typing import Any

import httpx2
import pytest

from tests.conftest import whereabouts
from tests.reliability.conftest import OwnedRedis, endpoint_config, owned_space
from tests.worker.conftest import serve, settings_for
from worker.api.app import create_api
from worker.client import GroundedClient
from worker.producer import Producer

pytestmark = pytest.mark.slow

TOKENS = {"tok-restart": "acme"}
OUTAGE_S = 2.0


def lines(n: int, tag: str) -> list[dict[str, Any]]:
    return [{"custom_id": f"{tag}-{i}", "question": f"[delay] When does the observatory open? ({tag} {i})"}
            for i in range(n)]


def test_redis_killed_and_restarted_mid_batch_loses_nothing_and_everyone_reconnects(
    owned_redis: OwnedRedis, fleet_for, faulty_openai, rel_data_dir
) -> None:
    space = owned_space(owned_redis)
    fleet = fleet_for(space)
    workers = [fleet.start(), fleet.start()]
    settings = settings_for(space, rel_data_dir, api_tokens=TOKENS)
    api = create_api(settings, producer=Producer(settings))
    config = endpoint_config(faulty_openai)
    with serve(api) as url, GroundedClient(url, "tok-restart") as client:
        first = client.submit(lines(12, "before"), config)
        deadline = time.monotonic() + 60
        while client.status(first["id"])["counts"]["succeeded"] < 3:
            assert time.monotonic() < deadline, workers[0].output()[-3000:]
            time.sleep(0.2)
        written = {r["job_id"]: r for r in client.results(first["id"])}
        assert client.status(first["id"])["counts"]["running"] > 0, "the restart must land mid-batch"

        owned_redis.kill()
        during = httpx2.get(f"{url}/healthz")
        assert during.status_code == 503 and during.json()["status"] == "unavailable"
        refused = httpx2.post(f"{url}/v1/batches", headers={"Authorization": "Bearer tok-restart"},
                              json={"config": config, "lines": lines(1, "outage")})
        assert refused.status_code == 503, refused.text
        time.sleep(OUTAGE_S)
        owned_redis.start()

        deadline = time.monotonic() + 20
        while httpx2.get(f"{url}/healthz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        second = client.submit(lines(4, "after"), config)
        try:
            finals = [client.wait(batch["id"], timeout=120) for batch in (first, second)]
        except TimeoutError as exc:
            logs = "\n".join(f"{w.name}:\n{w.output()[-4000:]}" for w in workers)
            raise AssertionError(f"{exc}\n{whereabouts(space, first['id'])}\n"
                                 f"{whereabouts(space, second['id'])}\n{logs}") from None

        assert [f["counts"]["succeeded"] for f in finals] == [12, 4]
        assert all(f["counts"]["failed"] == 0 and f["state"] == "completed" for f in finals)
        before = {r["job_id"]: r for r in client.results(first["id"])}
        assert sorted(r["custom_id"] for r in before.values()) == sorted(line["custom_id"] for line in lines(12, "before"))
        assert written.keys() <= before.keys()
        assert all(before[job_id]["status"] == "succeeded" for job_id in written)
        events = client.events(first["id"])
        finished = [e["job_id"] for e in events if e["event"] == "job_finished"]
        assert sorted(finished) == sorted(before) and sum(e["event"] == "batch_finished" for e in events) == 1
        assert len(list(client.results(second["id"]))) == 4
    dead = [w for w in workers if w.process.poll() is not None]
    assert not dead, "the workers must ride out the restart themselves:\n" + "\n".join(
        f"{w.name} exited {w.process.returncode}:\n{w.output()[-4000:]}" for w in dead)
