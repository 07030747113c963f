"""`grounded worker` as an operator runs it: node names that tell workers on one host apart (H14's
per-worker commands need them), and the arguments every worker shares."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO, RedisSpace, worker_env
from worker.settings import Settings
from worker.tasks.celery_app import create_app
from worker.tasks.worker_process import default_node_name, worker_argv


def test_every_worker_runs_without_gossip_and_mingle_but_with_heartbeats_for_flower() -> None:
    argv = worker_argv(name="w1@host", pool="threads", concurrency=4)
    assert {"--without-gossip", "--without-mingle"} <= set(argv) and "--without-heartbeat" not in argv
    assert argv[argv.index("--hostname") + 1] == "w1@host"


def test_default_node_names_differ_between_processes_of_one_host() -> None:
    here = default_node_name()
    other = subprocess.run([sys.executable, "-c", "from worker.tasks.worker_process import default_node_name;"
                            "print(default_node_name())"], cwd=REPO, capture_output=True, text=True, check=True)
    assert here != other.stdout.strip() and here.split("@")[1] == other.stdout.strip().split("@")[1]


def test_two_grounded_workers_on_one_host_answer_by_their_own_names(
    redis_space: RedisSpace, data_dir: Path, tmp_path: Path
) -> None:
    env = worker_env(redis_space, data_dir, GROUNDED_WORKER_NAME="from-env@here")
    grounded = str(Path(sys.executable).with_name("grounded"))
    logs = [tmp_path / "named.log", tmp_path / "env.log"]
    commands = [[grounded, "worker", "-p", "1", "-c", "1", "--name", "named@here"], [grounded, "worker", "-p", "1", "-c", "1"]]
    processes = [subprocess.Popen(c, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
                 for c, log in zip(commands, logs, strict=True)]
    app = create_app(Settings(redis_url=redis_space.url, key_prefix=redis_space.prefix))
    try:
        deadline = time.monotonic() + 90
        names: set[str] = set()
        while names != {"named@here", "from-env@here"} and time.monotonic() < deadline:
            names |= {name for reply in app.control.ping(timeout=1.0) for name in reply}
        assert names == {"named@here", "from-env@here"}, [log.read_text()[-2000:] for log in logs]
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)
        app.close()
    assert not any("DuplicateNodenameWarning" in log.read_text() for log in logs)
