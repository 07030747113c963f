"""Settings (H8) and the Celery app's settings (H6)."""

from __future__ import annotations

import pytest

from capabilities.tags import TagSigner
from worker.settings import MissingTagKeys, Settings
from worker.store.keys import QUEUE
from worker.tasks.celery_app import ANSWER_JOB, create_app


def test_H8_no_tag_keys_no_signer() -> None:
    with pytest.raises(MissingTagKeys, match="GROUNDED_TAG_KEYS is not set"):
        Settings(tag_keys=[]).signer()


def test_tag_keys_from_the_environment_newest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GROUNDED_TAG_KEYS", "new-key, old-key")
    signer = Settings().signer()
    assert signer.keys == (b"new-key", b"old-key")
    assert signer.sign("x") == TagSigner([b"new-key"]).sign("x")
    monkeypatch.setenv("GROUNDED_TAG_KEYS", '["a", "b"]')
    assert Settings().signer().keys == (b"a", b"b")
    assert "new-key" not in repr(Settings())


def test_api_tokens_map_tokens_to_tenants(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GROUNDED_API_TOKENS", "tok-a=acme, tok-b=globex")
    assert Settings().api_tokens == {"tok-a": "acme", "tok-b": "globex"}
    monkeypatch.setenv("GROUNDED_API_TOKENS", '{"tok-c": "initech"}')
    assert Settings().api_tokens == {"tok-c": "initech"}


def test_H6_celery_settings() -> None:
    settings = Settings(task_soft_limit_s=100, task_hard_limit_s=120, key_prefix="gw:")
    app = create_app(settings)
    conf = app.conf
    assert conf.task_acks_late is True and conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert conf.task_serializer == "json" and conf.accept_content == ["json"]
    options = conf.broker_transport_options
    # H14: a lease renewed by its live worker, not a timeout longer than any job
    assert options["visibility_timeout"] == settings.lease_s < settings.task_hard_limit_s
    assert options["unacked_restore_interval"] * options["unacked_restore_throttle"] <= 2
    assert options["unacked_mutex_expire"] <= 5  # a dead sweeper's lock delays no recovery for long
    assert "LeaseRenewal" in {getattr(step, "__name__", "") for step in app.steps["consumer"]}
    assert options["global_keyprefix"] == "gw:"
    assert conf.worker_send_task_events is True and conf.task_send_sent_event is True
    assert (conf.task_soft_time_limit, conf.task_time_limit) == (100, 120)
    assert conf.task_default_queue == QUEUE
    import worker.tasks.answer  # noqa: F401  registers the task (a shared task) on the worker's app
    from worker.app import app as worker_app

    names = [name for name in worker_app.tasks if not name.startswith("celery.")]
    assert names == [ANSWER_JOB] and all(name.startswith("grounded.") for name in names)
    app.close()


def test_hard_limit_below_soft_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="HARD_LIMIT_S must not be below"):
        Settings(task_soft_limit_s=100, task_hard_limit_s=50)
