"""`grounded worker --processes N`: N real worker processes under one supervisor, named apart,
started again when one dies, and stopped together with the same warm shutdown as one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from celery.signals import worker_ready

import worker.tasks.supervisor as supervisor_module
from tests.conftest import RedisServer, RedisSpace, new_space, worker_env
from tests.worker.conftest import FAKE_KEY, FAKE_KEY_ENV, PASSAGES, question_config, settings_for
from tests.worker.fake_openai import FakeOpenAI
from worker.producer import Producer
from worker.tasks.celery_app import create_app
from worker.tasks.supervisor import child_names

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def space(redis_server: RedisServer) -> Iterator[RedisSpace]:
    space = new_space(redis_server)
    yield space
    space.clean()


def start_supervisor(space: RedisSpace, data_dir: Path, log: Path, base: str) -> subprocess.Popen[bytes]:
    env = worker_env(space, data_dir, **{FAKE_KEY_ENV: FAKE_KEY})
    command = [sys.executable, "-m", "worker.cli", "worker", "--processes", "2", "--name", base, "-c", "2",
               "-l", "warning"]
    with log.open("wb") as handle:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)


def pids_answering(space: RedisSpace, data_dir: Path, names: list[str], log: Path, timeout: float = 60.0) -> dict[str, int]:
    """Node name -> pid of each child, once every one answers a ping."""
    app = create_app(settings_for(space, data_dir))
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            replies = app.control.ping(destination=names, timeout=0.5)
            if len(replies) == len(names):
                stats = app.control.inspect(destination=names, timeout=2).stats() or {}
                if len(stats) == len(names):
                    return {name: int(stats[name]["pid"]) for name in names}
        raise AssertionError(f"not every worker answered: {names}\n{log.read_text(errors='replace')[-3000:]}")
    finally:
        app.close()


def stop(supervisor: subprocess.Popen[bytes]) -> int:
    if supervisor.poll() is None:
        supervisor.send_signal(signal.SIGTERM)
    try:
        return supervisor.wait(timeout=60)
    except subprocess.TimeoutExpired:
        supervisor.kill()
        raise


def test_two_processes_are_named_apart_a_dead_one_comes_back_and_sigterm_stops_all(
    space: RedisSpace, data_dir: Path, tmp_path: Path
) -> None:
    base = f"t{uuid.uuid4().hex[:6]}@localhost"
    names = child_names(base, 2)
    assert names == [f"{base.split('@')[0]}-1@localhost", f"{base.split('@')[0]}-2@localhost"]
    log = tmp_path / "supervisor.log"
    supervisor = start_supervisor(space, data_dir, log, base)
    try:
        pids = pids_answering(space, data_dir, names, log)
        assert len(set(pids.values())) == 2 and supervisor.pid not in pids.values()
        psutil.Process(pids[names[0]]).kill()
        again = pids_answering(space, data_dir, names, log)
        assert again[names[0]] != pids[names[0]] and again[names[1]] == pids[names[1]]
        producer = Producer(settings_for(space, data_dir))
        try:
            report = producer.validate([{"custom_id": f"q{i}", "question": "When does the observatory open?"}
                                        for i in range(6)], question_config(PASSAGES))
            batch = producer.submit(report, tenant="tests")
            deadline = time.monotonic() + 60
            while not (progress := producer.store.progress_of(batch.id)).finished:
                assert time.monotonic() < deadline, progress
                time.sleep(0.1)
            assert progress.succeeded == 6
        finally:
            producer.app.close()
    finally:
        code = stop(supervisor)
    assert code == 0, log.read_text(errors="replace")[-3000:]
    assert not [pid for pid in again.values() if psutil.pid_exists(pid) and
                psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def test_sigterm_lets_a_running_job_finish_before_the_processes_exit(
    space: RedisSpace, data_dir: Path, tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    base = f"t{uuid.uuid4().hex[:6]}@localhost"
    log = tmp_path / "supervisor.log"
    supervisor = start_supervisor(space, data_dir, log, base)
    producer = Producer(settings_for(space, data_dir))
    try:
        pids_answering(space, data_dir, child_names(base, 2), log)
        config = question_config(PASSAGES, model="fake-model",
                                 endpoint={"base_url": fake_openai.base_url, "api_key_env": FAKE_KEY_ENV})
        key = uuid.uuid4().hex[:8]
        report = producer.validate([{"custom_id": "slow", "question": f"[slow:{key}] When does the observatory open?"}],
                                   config)
        batch = producer.submit(report, tenant="tests")
        deadline = time.monotonic() + 30
        while not fake_openai.requests_for(f"[slow:{key}]"):
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.05)
        code = stop(supervisor)  # the job is mid-request: a warm stop lets it finish
        assert code == 0, log.read_text(errors="replace")[-3000:]
        progress = producer.store.progress_of(batch.id)
        assert (progress.finished, progress.succeeded) == (True, 1)
        [result] = producer.store.iter_results(batch.id)
        assert result.turns[0].cited and result.turns[0].cited[0].capability == "passages"
    finally:
        stop(supervisor)
        producer.app.close()


def test_a_process_that_cannot_start_stops_the_group_with_exit_code_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor_module, "RESTART_INTERVAL_S", 0.01)
    monkeypatch.setattr(supervisor_module, "POLL_S", 0.01)
    group = supervisor_module.Supervisor(["a-1@h", "a-2@h"], lambda name: 3)  # exits before it is ready
    assert group.run() == 1
    assert max(child.boot_failures for child in group.children) == supervisor_module.MAX_BOOT_FAILURES


def test_a_process_killed_after_it_was_ready_is_forked_again_at_once_however_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outside kills (an OOM kill, kill -9) are not a crash loop: ten in a row, each child back in
    well under a second, and a SIGTERM still stops the group with 0."""
    monkeypatch.setattr(supervisor_module, "RESTART_INTERVAL_S", 0.05)
    monkeypatch.setattr(supervisor_module, "POLL_S", 0.01)

    def ready_then_wait(name: str) -> int:
        worker_ready.send(sender=None)
        time.sleep(60)
        return 0

    group = supervisor_module.Supervisor(["b-1@h"], ready_then_wait)
    [child] = group.children
    gaps: list[float] = []

    def kill_ten_times() -> None:
        for _ in range(10):
            while child.pid is None:
                time.sleep(0.005)
            pid = child.pid
            time.sleep(0.2)  # long enough to have written that it is ready
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            while child.pid in (None, pid):
                time.sleep(0.005)
            gaps.append(time.monotonic() - killed)
        os.kill(os.getpid(), signal.SIGTERM)  # the supervisor's handler forwards it

    killer = threading.Thread(target=kill_ten_times)
    killer.start()
    assert group.run() == 0
    killer.join()
    assert len(gaps) == 10 and max(gaps) < 0.5, gaps
    assert child.boot_failures == 0 and not group.failed
